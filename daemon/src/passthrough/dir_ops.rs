//! Directory handles and listing (READDIR / READDIRPLUS over `getdents64`).

use std::ffi::CStr;
use std::io;

use super::handle::HandleKind;
use super::{err, PassthroughFs};
use crate::protocol::filesystem::{AddEntry, DirEntry, Handle, Inode};
use crate::sys;

/// Bytes of `linux_dirent64` records read per `getdents64` call.
const DIRENT_BUF: usize = 16 * 1024;
/// Offset of `d_name` in `linux_dirent64` (u64 ino, i64 off, u16 reclen, u8 type).
const NAME_OFFSET: usize = 19;

/// One record of a `getdents64` buffer.
struct RawDirent<'a> {
    ino: u64,
    off: u64,
    typ: u8,
    /// The name with its NUL.
    name: &'a CStr,
}

/// Splits the record at the front of `buf`; `None` at the end, `EIO` on a malformed one.
fn next_dirent(buf: &[u8]) -> io::Result<Option<(RawDirent<'_>, &[u8])>> {
    if buf.is_empty() {
        return Ok(None);
    }
    let eio = || err(libc::EIO);
    let fixed = buf.get(..NAME_OFFSET).ok_or_else(eio)?;
    let word = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&fixed[i..i + 8]);
        u64::from_ne_bytes(b)
    };
    let reclen = usize::from(u16::from_ne_bytes([fixed[16], fixed[17]]));
    if reclen <= NAME_OFFSET || reclen > buf.len() {
        return Err(eio());
    }
    let name = CStr::from_bytes_until_nul(&buf[NAME_OFFSET..reclen]).map_err(|_| eio())?;
    Ok(Some((
        RawDirent {
            ino: word(0),
            off: word(8),
            typ: fixed[18],
            name,
        },
        &buf[reclen..],
    )))
}

impl PassthroughFs {
    pub(super) fn do_readdir(
        &self,
        inode: Inode,
        handle: Handle,
        offset: u64,
        plus: bool,
        add: &mut AddEntry,
    ) -> io::Result<()> {
        let h = self.handles.get_dir(inode, handle)?;
        let dir = self.dir_inode(inode)?;
        // Entries with attributes only from a directory inside the share (a host user may
        // have moved it out); the names alone come from the directory the guest holds.
        let plus = plus && self.check_inside(&dir).is_ok();
        let HandleKind::Dir { lock } = &h.kind else {
            return Err(err(libc::EBADF));
        };
        // The descriptor's position is shared state: one lister at a time.
        let _pos = lock.lock().unwrap_or_else(|p| p.into_inner());
        // The offset is a host d_off cookie (a signed loff_t) handed back as the guest got it.
        sys::lseek(h.fd(), offset as i64, libc::SEEK_SET)?;
        let mut buf = Vec::with_capacity(DIRENT_BUF);
        loop {
            if sys::getdents64_into(h.fd(), &mut buf)? == 0 {
                return Ok(());
            }
            let mut rest = buf.as_slice();
            while let Some((d, tail)) = next_dirent(rest)? {
                rest = tail;
                let name = d.name.to_bytes();
                let entry = if plus && name != b"." && name != b".." {
                    match self.do_lookup(&dir, d.name) {
                        Ok(e) => Some(e),
                        // Gone since getdents64 saw it: leave it out.
                        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                        // No attributes: the guest looks it up when it needs it.
                        Err(_) => None,
                    }
                } else {
                    None
                };
                let dirent = DirEntry {
                    ino: d.ino,
                    offset: d.off,
                    typ: u32::from(d.typ),
                    name,
                };
                let added = add(dirent, entry.as_ref());
                if !matches!(added, Ok(true)) {
                    // The guest did not get this entry: drop the reference we took for it.
                    if let Some(e) = &entry {
                        self.forget_inode(e.inode, 1);
                    }
                    return added.map(drop);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(ino: u64, off: u64, typ: u8, name: &[u8], reclen: u16) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&ino.to_ne_bytes());
        v.extend_from_slice(&off.to_ne_bytes());
        v.extend_from_slice(&reclen.to_ne_bytes());
        v.push(typ);
        v.extend_from_slice(name);
        v.resize(usize::from(reclen), 0);
        v
    }

    #[test]
    fn parses_records_and_rejects_garbage() {
        let mut buf = record(5, 10, 4, b"abc", 24);
        buf.extend(record(6, 20, 8, b"d", 24));
        let (a, rest) = next_dirent(&buf).unwrap().unwrap();
        assert_eq!(
            (a.ino, a.off, a.typ, a.name.to_bytes()),
            (5, 10, 4, &b"abc"[..])
        );
        let (b, rest) = next_dirent(rest).unwrap().unwrap();
        assert_eq!(b.name.to_bytes(), b"d");
        assert!(next_dirent(rest).unwrap().is_none());
        // reclen past the buffer, reclen too small, no NUL in the name.
        assert!(next_dirent(&record(1, 1, 0, b"x", 24)[..20]).is_err());
        assert!(next_dirent(&record(1, 1, 0, b"", 19)).is_err());
        assert!(next_dirent(&record(1, 1, 0, b"abcde", 24)).is_err());
    }
}
