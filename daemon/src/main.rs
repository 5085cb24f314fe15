//! `daxfsd`: the daemon binary. See `daxfsd --help`.

use clap::Parser;

use daxfsd::host::cli::Cli;

fn main() {
    let mut cli = Cli::parse();
    if let Err(e) = cli.normalize() {
        eprintln!("daxfsd: {e}");
        std::process::exit(2);
    }
    if cli.print_capabilities {
        println!("{}", Cli::capabilities_json());
        return;
    }
    daxfsd::host::startup::init_logging(cli.log_level, cli.syslog);
    if let Err(e) = daxfsd::host::run(&cli) {
        if cli.syslog {
            log::error!("{e}");
        }
        eprintln!("daxfsd: {e}");
        std::process::exit(1);
    }
}
