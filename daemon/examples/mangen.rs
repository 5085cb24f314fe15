//! Writes daxfsd's man page (roff) to stdout, generated from the same clap definitions as
//! `daxfsd --help`, so the two cannot drift. `make install` runs it:
//! `cargo run -q -p daxfsd --example mangen > daxfsd.1`.

use clap::CommandFactory;

fn main() -> std::io::Result<()> {
    let cmd = daxfsd::cli::Cli::command();
    clap_mangen::Man::new(cmd).render(&mut std::io::stdout())
}
