//! The security-context request extension (`FUSE_SECURITY_CTX`, FUSE 7.36+).
//!
//! With `FUSE_SECURITY_CTX` agreed, the guest kernel appends to CREATE, MKDIR, MKNOD,
//! SYMLINK and TMPFILE an extension area of `in_header.total_extlen * 8` bytes after the
//! payload: a list of extensions, each starting with `{u32 size; u32 type}` where `size`
//! counts the whole extension (header included, a multiple of 8). Types 0..=31 are a
//! `fuse_secctx_header` whose second field is the number of contexts that follow, each a
//! `fuse_secctx {u32 size; u32 padding}`, a NUL-terminated attribute name and `size` bytes
//! of context (Linux `fs/fuse/dir.c`, `get_security_context`; the kernel sends at most
//! one). Types above 31 are other extensions (`FUSE_EXT_GROUPS`, ...), skipped here.
//!
//! The area comes from the untrusted guest: every length is checked against what is left
//! before anything is read, a malformed area is `EINVAL` with a log line, and nothing is
//! allocated beyond the area itself (at most 65535 * 8 bytes).

use std::ffi::CString;
use std::io;

use crate::protocol::abi::{XATTR_NAME_MAX, XATTR_SIZE_MAX};

/// Highest extension type that is a security-context header (`FUSE_MAX_NR_SECCTX`).
const MAX_NR_SECCTX: u32 = 31;

/// One security context to set on a new inode: an xattr name (`security.*`) and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecCtx {
    pub name: CString,
    pub value: Vec<u8>,
}

fn bad(why: &str) -> io::Error {
    log::warn!("malformed security-context extension: {why}");
    io::Error::from_raw_os_error(libc::EINVAL)
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    let s = b.get(off..off.checked_add(4)?)?;
    Some(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

/// Parses the extension area `ext` and returns the security context it carries, if any
/// (`None` also when the header says zero contexts, as when the guest has no LSM).
pub fn parse(ext: &[u8]) -> io::Result<Option<SecCtx>> {
    let mut rest = ext;
    let mut found: Option<Option<SecCtx>> = None;
    while !rest.is_empty() {
        let (Some(size), Some(typ)) = (u32_at(rest, 0), u32_at(rest, 4)) else {
            return Err(bad("extension header cut short"));
        };
        let size = size as usize;
        if size < 8 || size % 8 != 0 || size > rest.len() {
            return Err(bad(&format!(
                "extension size {size} (left: {} bytes)",
                rest.len()
            )));
        }
        let (this, next) = rest.split_at(size);
        rest = next;
        if typ > MAX_NR_SECCTX {
            continue;
        }
        if found.is_some() {
            return Err(bad("more than one security-context header"));
        }
        found = Some(match typ {
            0 => None,
            1 => Some(one_context(&this[8..])?),
            n => return Err(bad(&format!("{n} contexts (at most 1 is supported)"))),
        });
    }
    Ok(found.flatten())
}

/// `fuse_secctx` + name + value, then at most 7 bytes of padding.
fn one_context(b: &[u8]) -> io::Result<SecCtx> {
    let Some(len) = u32_at(b, 0) else {
        return Err(bad("fuse_secctx cut short"));
    };
    let len = len as usize;
    if len > XATTR_SIZE_MAX {
        return Err(bad(&format!("context of {len} bytes")));
    }
    let tail = b.get(8..).ok_or_else(|| bad("fuse_secctx cut short"))?;
    let nul = tail
        .iter()
        .position(|&c| c == 0)
        .ok_or_else(|| bad("name without NUL"))?;
    let name = &tail[..nul];
    if name.is_empty() || name.len() > XATTR_NAME_MAX || !name.starts_with(b"security.") {
        return Err(bad(&format!(
            "name {:?} (must be security.*, at most {XATTR_NAME_MAX} bytes)",
            String::from_utf8_lossy(&name[..name.len().min(64)])
        )));
    }
    let after = &tail[nul + 1..];
    let value = after
        .get(..len)
        .ok_or_else(|| bad(&format!("context of {len} bytes, {} left", after.len())))?;
    if after.len() - len >= 8 {
        return Err(bad("trailing bytes after the context"));
    }
    Ok(SecCtx {
        name: CString::new(name).map_err(|_| bad("NUL in name"))?,
        value: value.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What Linux 6.12 sends for one context.
    fn area(name: &[u8], value: &[u8], nr: u32) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&(value.len() as u32).to_le_bytes());
        body.extend_from_slice(&0u32.to_le_bytes());
        body.extend_from_slice(name);
        body.push(0);
        body.extend_from_slice(value);
        let mut total = 8 + body.len();
        total = total.div_ceil(8) * 8;
        let mut v = Vec::new();
        v.extend_from_slice(&(total as u32).to_le_bytes());
        v.extend_from_slice(&nr.to_le_bytes());
        v.extend_from_slice(&body);
        v.resize(total, 0);
        v
    }

    fn errno(r: io::Result<Option<SecCtx>>) -> i32 {
        r.unwrap_err().raw_os_error().unwrap()
    }

    #[test]
    fn parses_what_the_kernel_sends() {
        let got = parse(&area(b"security.selinux", b"system_u:object_r:x_t:s0\0", 1)).unwrap();
        assert_eq!(
            got,
            Some(SecCtx {
                name: CString::new("security.selinux").unwrap(),
                value: b"system_u:object_r:x_t:s0\0".to_vec(),
            })
        );
        // No LSM in the guest: a bare header with zero contexts.
        let mut none = 8u32.to_le_bytes().to_vec();
        none.extend_from_slice(&0u32.to_le_bytes());
        assert_eq!(parse(&none).unwrap(), None);
        assert_eq!(parse(&[]).unwrap(), None);
        // Another extension (supplementary groups, type 32) before it is skipped.
        let mut groups = 16u32.to_le_bytes().to_vec();
        groups.extend_from_slice(&32u32.to_le_bytes());
        groups.extend_from_slice(&[1, 0, 0, 0, 7, 0, 0, 0]);
        groups.extend_from_slice(&area(b"security.x", b"v", 1));
        assert_eq!(parse(&groups).unwrap().unwrap().value, b"v");
    }

    #[test]
    fn malformed_areas_are_einval() {
        let good = area(b"security.selinux", b"ctx", 1);
        let mut cases: Vec<Vec<u8>> = vec![
            good[..4].to_vec(),                    // header cut short
            good[..good.len() - 8].to_vec(),       // size past the area
            area(b"security.selinux", b"ctx", 2),  // two contexts
            area(b"user.selinux", b"ctx", 1),      // not security.*
            area(b"", b"ctx", 1),                  // empty name
            area(&[b's'; 300], b"ctx", 1),         // name too long
            [good.clone(), good.clone()].concat(), // two headers
        ];
        // Size 0, size not a multiple of 8, huge size.
        for size in [0u32, 12, u32::MAX] {
            let mut v = good.clone();
            v[..4].copy_from_slice(&size.to_le_bytes());
            cases.push(v);
        }
        // Context length past the end, and far past the limit.
        for len in [64u32, u32::MAX] {
            let mut v = good.clone();
            v[8..12].copy_from_slice(&len.to_le_bytes());
            cases.push(v);
        }
        // Name without NUL: fill everything after fuse_secctx.
        let mut v = good.clone();
        for b in &mut v[16..] {
            *b = b'a';
        }
        cases.push(v);
        // Context shorter than claimed leaves 8+ trailing bytes.
        let mut v = area(b"security.selinux", b"0123456789abcdef", 1);
        v[8..12].copy_from_slice(&1u32.to_le_bytes());
        cases.push(v);
        for (i, c) in cases.into_iter().enumerate() {
            assert_eq!(errno(parse(&c)), libc::EINVAL, "case {i}: {c:?}");
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // Every prefix and every one-byte corruption of a good area, then pseudo-random
        // areas: each parses or is EINVAL.
        let good = area(b"security.selinux", b"system_u:object_r:x_t:s0\0", 1);
        let mut inputs: Vec<Vec<u8>> = (0..=good.len()).map(|n| good[..n].to_vec()).collect();
        for i in 0..good.len() {
            for b in [0u8, 1, 7, 8, 0x20, 0xff] {
                let mut v = good.clone();
                v[i] = b;
                inputs.push(v);
            }
        }
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..2000 {
            let mut v = Vec::new();
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let len = (x >> 33) as usize % 96;
            for _ in 0..len {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                // Mostly small values, so sizes and counts are often plausible.
                v.push(if x >> 62 == 0 {
                    (x >> 33) as u8
                } else {
                    (x >> 59) as u8
                });
            }
            inputs.push(v);
        }
        for v in inputs {
            if let Err(e) = parse(&v) {
                assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{v:?}");
            }
        }
    }
}
