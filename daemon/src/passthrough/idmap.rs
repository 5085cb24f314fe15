//! `--translate-uid` / `--translate-gid`: uid and gid translation done by the daemon, with
//! virtiofsd's syntax and meaning (no user namespace involved).
//!
//! Each entry is `TYPE:A:B:COUNT` (any one non-alphanumeric separator other than `-` and
//! `_` in place of `:`):
//!
//! - `guest:GUEST:HOST:COUNT`: guest ids GUEST.. map 1:1 to host ids HOST.. (guest to host);
//! - `host:HOST:GUEST:COUNT`: host ids HOST.. map 1:1 to guest ids GUEST.. (host to guest);
//! - `squash-guest:GUEST:HOST:COUNT`: COUNT guest ids all map to host id HOST;
//! - `squash-host:HOST:GUEST:COUNT`: COUNT host ids all map to guest id GUEST;
//! - `forbid-guest:GUEST:COUNT`: guest ids that may not create or own files (EPERM);
//! - `map:GUEST:HOST:COUNT`: both directions, 1:1.
//!
//! Ids no entry covers map to themselves; the two directions are independent. Guest to host
//! applies to the caller's ids when a file is created and to SETATTR's new owner; host to
//! guest applies to every attribute reply. Overlapping entries in one direction are refused.

use std::ops::Range;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// `from.start + k` maps to `base + k`.
    Base(u32),
    /// Every id maps to this one.
    Squash(u32),
    /// Refused.
    Fail,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    from: Range<u64>,
    to: Target,
}

/// One direction's entries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Direction(Vec<Entry>);

impl Direction {
    fn push(&mut self, e: Entry, what: &str) -> Result<(), String> {
        if self
            .0
            .iter()
            .any(|o| o.from.start < e.from.end && e.from.start < o.from.end)
        {
            return Err(format!("{what}: overlaps an earlier entry"));
        }
        self.0.push(e);
        Ok(())
    }

    fn map(&self, id: u32) -> Option<u32> {
        let x = u64::from(id);
        match self.0.iter().find(|e| e.from.contains(&x)) {
            None => Some(id),
            Some(e) => match e.to {
                // In range by construction: base + (x - start) < base + count <= 2^32.
                Target::Base(b) => u32::try_from(u64::from(b) + (x - e.from.start)).ok(),
                Target::Squash(t) => Some(t),
                Target::Fail => None,
            },
        }
    }
}

/// A uid or gid translation table (identity when empty).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdMap {
    to_host: Direction,
    to_guest: Direction,
}

impl IdMap {
    /// Parses the entries of `--translate-uid` (or `-gid`, named by `option`).
    pub fn parse<S: AsRef<str>>(option: &str, entries: &[S]) -> Result<Self, String> {
        let mut m = IdMap::default();
        for e in entries {
            let s = e.as_ref();
            let what = format!("{option} '{s}'");
            let sep = s
                .chars()
                .find(|c| !(c.is_alphanumeric() || *c == '-' || *c == '_'))
                .ok_or_else(|| format!("{what}: expected TYPE:A:B:COUNT"))?;
            let mut parts = s.split(sep);
            let kind = parts.next().unwrap_or_default().to_lowercase();
            let nums = parts
                .map(|p| {
                    p.parse::<u32>()
                        .map_err(|_| format!("{what}: '{p}' is not an id or count"))
                })
                .collect::<Result<Vec<u32>, String>>()?;
            let want = if kind == "forbid-guest" { 2 } else { 3 };
            if nums.len() != want {
                return Err(format!(
                    "{what}: {kind} takes {want} numbers, got {}",
                    nums.len()
                ));
            }
            let range = |start: u32, count: u32| -> Result<Range<u64>, String> {
                let end = u64::from(start) + u64::from(count);
                if end > 1 << 32 {
                    return Err(format!("{what}: the range goes past the largest id"));
                }
                Ok(u64::from(start)..end)
            };
            let fits = |base: u32, count: u32| {
                if u64::from(base) + u64::from(count) > 1 << 32 {
                    Err(format!("{what}: the target range goes past the largest id"))
                } else {
                    Ok(())
                }
            };
            match kind.as_str() {
                "guest" => {
                    fits(nums[1], nums[2])?;
                    m.to_host.push(
                        Entry {
                            from: range(nums[0], nums[2])?,
                            to: Target::Base(nums[1]),
                        },
                        &what,
                    )?
                }
                "host" => {
                    fits(nums[1], nums[2])?;
                    m.to_guest.push(
                        Entry {
                            from: range(nums[0], nums[2])?,
                            to: Target::Base(nums[1]),
                        },
                        &what,
                    )?
                }
                "squash-guest" => m.to_host.push(
                    Entry {
                        from: range(nums[0], nums[2])?,
                        to: Target::Squash(nums[1]),
                    },
                    &what,
                )?,
                "squash-host" => m.to_guest.push(
                    Entry {
                        from: range(nums[0], nums[2])?,
                        to: Target::Squash(nums[1]),
                    },
                    &what,
                )?,
                "forbid-guest" => m.to_host.push(
                    Entry {
                        from: range(nums[0], nums[1])?,
                        to: Target::Fail,
                    },
                    &what,
                )?,
                "map" => {
                    fits(nums[0], nums[2])?;
                    fits(nums[1], nums[2])?;
                    m.to_host.push(
                        Entry {
                            from: range(nums[0], nums[2])?,
                            to: Target::Base(nums[1]),
                        },
                        &what,
                    )?;
                    m.to_guest.push(
                        Entry {
                            from: range(nums[1], nums[2])?,
                            to: Target::Base(nums[0]),
                        },
                        &what,
                    )?;
                }
                other => {
                    return Err(format!(
                        "{what}: unknown type '{other}' (guest, host, squash-guest, squash-host, forbid-guest or map)"
                    ))
                }
            }
        }
        Ok(m)
    }

    /// Whether this map changes nothing.
    pub fn is_identity(&self) -> bool {
        self.to_host.0.is_empty() && self.to_guest.0.is_empty()
    }

    /// The host id for a guest id; `None` if the guest id is forbidden.
    pub fn to_host(&self, guest: u32) -> Option<u32> {
        self.to_host.map(guest)
    }

    /// The guest's view of a host id.
    pub fn to_guest(&self, host: u32) -> u32 {
        // Host-to-guest entries never fail.
        self.to_guest.map(host).unwrap_or(host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_type() {
        let m = IdMap::parse(
            "--translate-uid",
            &[
                "map:1000:2000:10",
                "squash-guest:5000:65534:100",
                "forbid-guest:7000:1",
                "host/0/3000/1",
                "squash-host:100:99:5",
                "guest:8000:9000:2",
            ],
        )
        .unwrap();
        assert_eq!(m.to_host(1003), Some(2003));
        assert_eq!(m.to_guest(2003), 1003);
        assert_eq!(m.to_host(5099), Some(65534));
        assert_eq!(m.to_host(5100), Some(5100), "outside every range: identity");
        assert_eq!(m.to_host(7000), None);
        assert_eq!(m.to_guest(0), 3000);
        assert_eq!(m.to_host(0), Some(0), "directions are independent");
        assert_eq!(m.to_guest(104), 99);
        assert_eq!(m.to_host(8001), Some(9001));
        assert_eq!(m.to_guest(9001), 9001);
        assert!(IdMap::parse::<&str>("--translate-gid", &[])
            .unwrap()
            .is_identity());
    }

    #[test]
    fn bad_entries_are_refused_naming_them() {
        for (e, want) in [
            ("map:1:2", "takes 3 numbers"),
            ("forbid-guest:1:2:3", "takes 2 numbers"),
            ("swap:1:2:3", "unknown type 'swap'"),
            ("map:1:x:3", "'x' is not an id"),
            ("map:4294967295:1:2", "past the largest id"),
            ("nothing", "expected TYPE:A:B:COUNT"),
        ] {
            let err = IdMap::parse("--translate-uid", &[e]).unwrap_err();
            assert!(err.contains(e) && err.contains(want), "{e}: {err}");
        }
        let err = IdMap::parse("--translate-uid", &["guest:10:0:10", "map:15:100:1"]).unwrap_err();
        assert!(err.contains("overlaps"), "{err}");
    }
}
