//! `--syslog`: log records to the system log through `/dev/log`.
//!
//! The datagram socket is connected at start-up, before the sandbox hides `/dev/log`; a
//! connected socket keeps working inside every sandbox. Records use facility `user` (as
//! virtiofsd) and the RFC 3164 form `<PRI>daxfsd[PID]: message`, which rsyslog,
//! syslog-ng and journald all accept (they add the time). PID is the daemon's pid as the
//! host sees it (the one in the pid file), also inside the namespace sandbox. Should the
//! system log go away while the daemon runs, records go to stderr instead.

use std::io::{self, Write};
use std::os::unix::net::UnixDatagram;
use std::path::Path;

/// Facility `user` (1) shifted into the priority value.
const FACILITY_USER: u8 = 1 << 3;

/// A [`log::Log`] that writes to the system log.
pub struct SyslogLogger {
    sock: UnixDatagram,
    pid: u32,
}

impl SyslogLogger {
    /// Connects to the system log at `path` (normally `/dev/log`).
    pub fn connect(path: &Path) -> io::Result<Self> {
        let sock = UnixDatagram::unbound()?;
        sock.connect(path)?;
        Ok(SyslogLogger {
            sock,
            pid: std::process::id(),
        })
    }

    /// The datagram for one record.
    pub fn format(&self, level: log::Level, msg: &str) -> String {
        let severity = match level {
            log::Level::Error => 3,
            log::Level::Warn => 4,
            log::Level::Info => 6,
            log::Level::Debug | log::Level::Trace => 7,
        };
        // One record per datagram: a newline inside would start a bogus record on some
        // daemons, so flatten it.
        let flat = msg.replace('\n', " ");
        format!("<{}>daxfsd[{}]: {flat}", FACILITY_USER | severity, self.pid)
    }
}

impl log::Log for SyslogLogger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &log::Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let msg = r.args().to_string();
        if self
            .sock
            .send(self.format(r.level(), &msg).as_bytes())
            .is_err()
        {
            let _ = writeln!(io::stderr(), "daxfsd: {} {msg}", r.level());
        }
    }

    fn flush(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_reach_a_syslog_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let server = UnixDatagram::bind(&path).unwrap();
        let l = SyslogLogger::connect(&path).unwrap();
        let rec = l.format(log::Level::Warn, "two\nlines");
        assert_eq!(
            rec,
            format!("<12>daxfsd[{}]: two lines", std::process::id())
        );
        l.sock.send(rec.as_bytes()).unwrap();
        let mut buf = [0u8; 256];
        let n = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], rec.as_bytes());
        assert!(SyslogLogger::connect(&dir.path().join("none")).is_err());
    }
}
