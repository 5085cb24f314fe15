//! Host-change notifications on a host mount (`--mount --notify`, issue #42): the kernel
//! takes FUSE notify messages written to /dev/fuse (`unique` 0, the code in `error`) at any
//! time, from any thread. A thread of its own drains the [`Notifier`] into the device, so no
//! reader ever writes a notification while it serves a request (the kernel may then wait
//! for that very request: libfuse warns against it too).
//!
//! Only the kernel's codes go out: `FSNOTIFY` exists in our guest patch only (on the host,
//! watchers of the FUSE mount see what the kernel itself reports), and `INC_EPOCH` needs
//! Linux 6.16 (an older kernel refuses it: logged once). A notification for an inode or
//! entry the kernel no longer caches fails with ENOENT, which is the normal case.

use std::fs::File;
use std::io::{self, Write};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;

use crate::protocol::notify::{code, Notifier};

/// Starts the thread that writes `notifier`'s messages to the device `dev`; the notifier is
/// live from now on (a host mount has no negotiation).
pub fn spawn(dev: Arc<File>, notifier: Arc<Notifier>) -> io::Result<()> {
    let (tx, rx) = sync_channel::<()>(1);
    notifier.set_waker(Box::new(move || {
        let _ = tx.try_send(());
    }));
    notifier.set_live(true);
    std::thread::Builder::new()
        .name("fuse-notify".into())
        .spawn(move || run(&dev, &notifier, &rx))?;
    Ok(())
}

fn run(dev: &File, notifier: &Notifier, woken: &Receiver<()>) {
    let mut epoch_refused = false;
    loop {
        while let Some(msg) = notifier.front() {
            let c = i32::from_le_bytes(msg[4..8].try_into().unwrap_or_default());
            notifier.pop_front();
            if c == code::FSNOTIFY || (c == code::INC_EPOCH && epoch_refused) {
                continue;
            }
            match (&*dev).write(&msg) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENODEV) => {
                    log::debug!("notifications: the mount is gone");
                    return;
                }
                Err(e) if c == code::INC_EPOCH => {
                    epoch_refused = true;
                    log::warn!(
                        "notifications: the kernel refuses INC_EPOCH ({e}; Linux 6.16+): \
                         after a burst of host changes the mount may serve stale entries \
                         until their timeout"
                    );
                }
                Err(e) => log::debug!("notification code {c}: {e}"),
            }
        }
        if woken.recv().is_err() {
            return;
        }
    }
}
