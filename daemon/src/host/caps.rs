//! Capabilities: once the sandbox is set up, the daemon keeps only what serving files needs.
//!
//! The kept set is virtiofsd's: `CHOWN`, `DAC_OVERRIDE`, `FOWNER`, `FSETID`, `SETGID`,
//! `SETUID`, `MKNOD` and `SETFCAP`, changed by `--modcaps` (`+name` adds, `-name` removes,
//! `:`-separated, e.g. `--modcaps=+sys_admin:-mknod`). [`drop_to`] removes every other
//! capability from the bounding set, clears the ambient and inheritable sets, and sets the
//! permitted and effective sets to the kept ones (never adding one the process did not have).
//! Plain `libc` system calls: no libcap.

use std::io;

/// Capability numbers and their names (`include/uapi/linux/capability.h`).
const NAMES: [&str; 41] = [
    "chown",
    "dac_override",
    "dac_read_search",
    "fowner",
    "fsetid",
    "kill",
    "setgid",
    "setuid",
    "setpcap",
    "linux_immutable",
    "net_bind_service",
    "net_broadcast",
    "net_admin",
    "net_raw",
    "ipc_lock",
    "ipc_owner",
    "sys_module",
    "sys_rawio",
    "sys_chroot",
    "sys_ptrace",
    "sys_pacct",
    "sys_admin",
    "sys_boot",
    "sys_nice",
    "sys_resource",
    "sys_time",
    "sys_tty_config",
    "mknod",
    "lease",
    "audit_write",
    "audit_control",
    "setfcap",
    "mac_override",
    "mac_admin",
    "syslog",
    "wake_alarm",
    "block_suspend",
    "audit_read",
    "perfmon",
    "bpf",
    "checkpoint_restore",
];

pub const CAP_CHOWN: u32 = 0;
pub const CAP_DAC_OVERRIDE: u32 = 1;
pub const CAP_DAC_READ_SEARCH: u32 = 2;
pub const CAP_FOWNER: u32 = 3;
pub const CAP_FSETID: u32 = 4;
pub const CAP_SETGID: u32 = 6;
pub const CAP_SETUID: u32 = 7;
pub const CAP_SETPCAP: u32 = 8;
pub const CAP_LINUX_IMMUTABLE: u32 = 9;
pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_MKNOD: u32 = 27;
pub const CAP_SETFCAP: u32 = 31;

/// `_LINUX_CAPABILITY_VERSION_3`: 64-bit sets in two 32-bit halves.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// A set of capabilities, bit `n` = capability `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CapSet(pub u64);

impl CapSet {
    /// The capabilities virtiofsd keeps by default.
    pub fn daemon_default() -> CapSet {
        CapSet::of(&[
            CAP_CHOWN,
            CAP_DAC_OVERRIDE,
            CAP_FOWNER,
            CAP_FSETID,
            CAP_SETGID,
            CAP_SETUID,
            CAP_MKNOD,
            CAP_SETFCAP,
        ])
    }

    /// The set holding `caps`.
    pub fn of(caps: &[u32]) -> CapSet {
        CapSet(caps.iter().fold(0, |s, &c| s | (1u64 << c)))
    }

    pub fn contains(self, cap: u32) -> bool {
        cap < 64 && self.0 & (1u64 << cap) != 0
    }

    /// Applies a `--modcaps` specification: `+name` / `-name` items separated by `:`; names
    /// without the `cap_` prefix or with it, any case.
    pub fn modify(self, spec: &str) -> Result<CapSet, String> {
        let mut set = self.0;
        for item in spec.split(':').filter(|i| !i.is_empty()) {
            let (add, name) = match (item.strip_prefix('+'), item.strip_prefix('-')) {
                (Some(n), _) => (true, n),
                (_, Some(n)) => (false, n),
                _ => {
                    return Err(format!(
                        "--modcaps: {item:?} must start with + or - (e.g. +sys_admin:-mknod)"
                    ))
                }
            };
            let cap = by_name(name).ok_or_else(|| {
                format!("--modcaps: unknown capability {name:?} (e.g. sys_admin, mknod)")
            })?;
            if add {
                set |= 1u64 << cap;
            } else {
                set &= !(1u64 << cap);
            }
        }
        Ok(CapSet(set))
    }

    /// Names of the capabilities in the set, for log lines.
    pub fn names(self) -> Vec<&'static str> {
        (0..NAMES.len() as u32)
            .filter(|&c| self.contains(c))
            .map(|c| NAMES[c as usize])
            .collect()
    }
}

/// The number of a capability name (`sys_admin`, `CAP_SYS_ADMIN`, ...).
pub fn by_name(name: &str) -> Option<u32> {
    let lower = name.to_ascii_lowercase();
    let bare = lower.strip_prefix("cap_").unwrap_or(&lower);
    NAMES.iter().position(|n| *n == bare).map(|p| p as u32)
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The calling thread's (effective, permitted, inheritable) sets.
pub fn current() -> io::Result<(CapSet, CapSet, CapSet)> {
    let mut hdr = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: `hdr` and `data` are valid, writable structs of the layout capget(2) expects for
    // version 3 (two data elements).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut hdr as *mut CapHeader,
            data.as_mut_ptr(),
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    let join =
        |f: fn(&CapData) -> u32| CapSet(u64::from(f(&data[0])) | (u64::from(f(&data[1])) << 32));
    Ok((
        join(|d| d.effective),
        join(|d| d.permitted),
        join(|d| d.inheritable),
    ))
}

/// Keeps only `keep` (intersected with what the process has): bounding set, ambient and
/// inheritable cleared, permitted = effective = kept. Call it while single-threaded: capset
/// changes only the calling thread, and threads inherit from their creator.
pub fn drop_to(keep: CapSet) -> io::Result<()> {
    let (eff, perm, _) = current()?;
    // The bounding set first: dropping from it needs CAP_SETPCAP, which we may not keep.
    if eff.contains(CAP_SETPCAP) {
        for cap in 0..64u32 {
            if keep.contains(cap) {
                continue;
            }
            // SAFETY: prctl with integer arguments only.
            let ret = unsafe {
                libc::prctl(
                    libc::PR_CAPBSET_DROP,
                    libc::c_ulong::from(cap),
                    0 as libc::c_ulong,
                    0 as libc::c_ulong,
                    0 as libc::c_ulong,
                )
            };
            if ret < 0 {
                let e = io::Error::last_os_error();
                // EINVAL: past the last capability this kernel knows.
                if e.raw_os_error() == Some(libc::EINVAL) {
                    break;
                }
                return Err(io::Error::new(
                    e.kind(),
                    format!("cannot drop capability {cap} from the bounding set: {e}"),
                ));
            }
        }
    }
    // SAFETY: prctl with integer arguments only.
    let ret = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if ret < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
        return Err(io::Error::last_os_error());
    }
    let kept = keep.0 & perm.0;
    let lo = kept as u32;
    let hi = (kept >> 32) as u32;
    let mut hdr = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [
        CapData {
            effective: lo,
            permitted: lo,
            inheritable: 0,
        },
        CapData {
            effective: hi,
            permitted: hi,
            inheritable: 0,
        },
    ];
    // SAFETY: `hdr` and `data` are valid structs of the layout capset(2) expects for version
    // 3; the kernel only reads `data`.
    let ret = unsafe { libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()) };
    if ret < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("cannot set capabilities: {e}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_modcaps() {
        assert_eq!(by_name("sys_admin"), Some(CAP_SYS_ADMIN));
        assert_eq!(by_name("CAP_MKNOD"), Some(CAP_MKNOD));
        assert_eq!(by_name("checkpoint_restore"), Some(40));
        assert_eq!(by_name("bogus"), None);
        let d = CapSet::daemon_default();
        assert_eq!(
            d.names(),
            [
                "chown",
                "dac_override",
                "fowner",
                "fsetid",
                "setgid",
                "setuid",
                "mknod",
                "setfcap"
            ]
        );
        let m = d.modify("+sys_admin:-mknod").unwrap();
        assert!(m.contains(CAP_SYS_ADMIN) && !m.contains(CAP_MKNOD) && m.contains(CAP_CHOWN));
        assert_eq!(d.modify("").unwrap(), d);
        assert!(d.modify("sys_admin").unwrap_err().contains("+ or -"));
        assert!(d
            .modify("+nope")
            .unwrap_err()
            .contains("unknown capability"));
    }
}
