//! The daemon process around the protocol: command line, sandbox, system-call filter,
//! capabilities, logging, pid and socket files, and the two modes that wire the layers
//! together: the vhost-user daemon ([`daemon`]) and the /dev/fuse mount ([`mount`]). Both
//! take their shared start-up from [`startup`] and never call each other; [`run`] picks one.

pub mod caps;
pub mod cli;
pub mod daemon;
mod dax_channel;
pub mod holder;
pub mod keeper_link;
pub mod mount;
pub mod runfiles;
pub mod sandbox;
pub mod seccomp;
pub mod startup;
pub mod syslog;

/// Runs the daemon in the mode the command line asks for: a /dev/fuse mount (`--mount`) or a
/// vhost-user daemon, under a holder with `--restartable` ([`holder`]).
pub fn run(cli: &cli::Cli) -> std::io::Result<()> {
    if cli.mount.is_some() {
        mount::run(cli)
    } else if cli.restartable && std::env::var_os(holder::HOLDER_ENV).is_none() {
        holder::run(cli)
    } else {
        daemon::run(cli)
    }
}
