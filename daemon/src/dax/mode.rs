//! How guest mappings reach the frontend (`--dax-mapping`).
//!
//! QEMU 11.1.3 crashes (SIGSEGV) when it reads a SHMEM request after a `stop` began:
//! `vhost_dev_stop` clears the device pointer that the SHMEM handlers read without a check,
//! and the backend learns of the stop only after the point of no return (ARCHITECTURE.md,
//! "DAX on QEMU 11.1"). A window whose frontend mappings follow the guest's mappings sends
//! SHMEM requests all the time the guest maps and unmaps, so pausing, snapshotting or saving
//! such a VM can kill it. The pool sends one SHMEM_MAP per session (the whole window, at the
//! guest's first mapping) and none after it, so no operator action can meet that race.

use std::fmt;
use std::str::FromStr;

/// Where guest mappings go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MapMode {
    /// Every guest mapping is a copy of its file range in one memfd that the frontend maps
    /// once (writable ones merged back into their files at the sync points): no SHMEM request
    /// after the first, so a VM can be paused at any time. The default.
    #[default]
    Pooled,
    /// Zero-copy: each guest mapping is a frontend mapping of the file itself (host page-cache
    /// pages shared by every guest), within the frontend's memory-slot budget (a window with
    /// more guest ranges than the budget, such as 1 GiB and more with Linux 6.12's 2 MiB
    /// ranges, is pooled anyway; the hybrid guest kernel's ranges, the window over 128, never
    /// are that many). With QEMU 11.1.3, pausing the VM while the guest maps or unmaps can
    /// crash QEMU.
    Direct,
}

impl FromStr for MapMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "pooled" => Ok(MapMode::Pooled),
            "direct" => Ok(MapMode::Direct),
            _ => Err(format!(
                "invalid DAX mapping mode {s:?}: use pooled or direct"
            )),
        }
    }
}

impl fmt::Display for MapMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MapMode::Pooled => "pooled",
            MapMode::Direct => "direct",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_both_modes() {
        for m in [MapMode::Pooled, MapMode::Direct] {
            assert_eq!(m.to_string().parse::<MapMode>(), Ok(m));
        }
        assert_eq!(MapMode::default(), MapMode::Pooled);
        assert!("zero-copy"
            .parse::<MapMode>()
            .unwrap_err()
            .contains("pooled or direct"));
    }
}
