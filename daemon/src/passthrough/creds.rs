//! Creating files with the caller's identity.
//!
//! When the daemon runs as root, operations that create a file (CREATE, MKDIR, MKNOD,
//! SYMLINK, TMPFILE) switch the *calling thread's* effective uid and gid to the guest
//! caller's, so the host file gets the right owner and the host kernel checks the caller's
//! permissions. The switch uses the raw `setresuid`/`setresgid` system calls (glibc's
//! wrappers would switch every thread) and a guard restores the daemon's ids on every path
//! out. When the daemon is not root it cannot switch, and files get the daemon's ids.

use std::io;

use crate::protocol::filesystem::Context;
use crate::sys;

/// The daemon's own ids, and whether it may switch.
#[derive(Debug, Clone, Copy)]
pub(super) struct Creds {
    enabled: bool,
    uid: u32,
    gid: u32,
}

/// Restores the daemon's ids when dropped.
#[must_use]
pub(super) struct CredsGuard {
    restore: Option<(u32, u32)>,
}

impl Creds {
    /// Switching is enabled when the daemon runs with effective uid 0.
    pub fn detect() -> Self {
        let uid = sys::geteuid();
        Creds {
            enabled: uid == 0,
            uid,
            gid: sys::getegid(),
        }
    }

    /// Switches the thread to `ctx.uid`/`ctx.gid` until the guard is dropped.
    pub fn switch_to(&self, ctx: &Context) -> io::Result<CredsGuard> {
        if !self.enabled || (ctx.uid == self.uid && ctx.gid == self.gid) {
            return Ok(CredsGuard { restore: None });
        }
        // -1 means "unchanged" to setresuid/setresgid: it would silently keep root.
        if ctx.uid == u32::MAX || ctx.gid == u32::MAX {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // The gid first: changing it needs CAP_SETGID, which a non-zero euid has lost.
        sys::set_thread_egid(ctx.gid)?;
        let guard = CredsGuard {
            restore: Some((self.uid, self.gid)),
        };
        sys::set_thread_euid(ctx.uid)?;
        Ok(guard)
    }
}

impl Drop for CredsGuard {
    fn drop(&mut self) {
        let Some((uid, gid)) = self.restore else {
            return;
        };
        // The uid first, to regain the capabilities needed to restore the gid. A thread
        // that cannot get its ids back must not serve another request.
        if let Err(e) = sys::set_thread_euid(uid).and_then(|()| sys::set_thread_egid(gid)) {
            log::error!("cannot restore daemon credentials: {e}");
            std::process::abort();
        }
    }
}
