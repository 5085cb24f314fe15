//! Decoding of the variable parts of a request (names, paths, xattr names): every check a
//! name passes before a handler hands it to the filesystem.

use std::ffi::{CStr, CString};
use std::io;

use crate::protocol::abi::{NAME_MAX, PATH_MAX, XATTR_NAME_MAX};
use crate::protocol::iobuf::Reader;

use super::{einval, err};

/// Splits a NUL-terminated string off the front of `buf`.
pub(super) fn split_cstr(buf: &[u8]) -> io::Result<(&CStr, &[u8])> {
    let nul = buf.iter().position(|&b| b == 0).ok_or_else(|| {
        log::warn!("string without NUL terminator");
        einval()
    })?;
    let s = CStr::from_bytes_with_nul(&buf[..=nul]).map_err(|_| einval())?;
    Ok((s, &buf[nul + 1..]))
}

pub(super) fn check_empty(rest: &[u8]) -> io::Result<()> {
    if rest.is_empty() {
        Ok(())
    } else {
        log::warn!("{} unexpected trailing bytes", rest.len());
        Err(einval())
    }
}

/// A name must be one path component: non-empty, no `/`, at most `NAME_MAX` bytes.
pub(super) fn check_component(name: &CStr) -> io::Result<()> {
    let b = name.to_bytes();
    if b.len() > NAME_MAX {
        return Err(err(libc::ENAMETOOLONG));
    }
    if b.is_empty() || b.contains(&b'/') {
        log::warn!("invalid name component {name:?}");
        return Err(einval());
    }
    Ok(())
}

pub(super) fn check_xattr_name(name: &CStr) -> io::Result<()> {
    let n = name.to_bytes().len();
    if n == 0 {
        return Err(einval());
    }
    if n > XATTR_NAME_MAX {
        return Err(err(libc::ERANGE));
    }
    Ok(())
}

/// The rest of the request as exactly one name component.
pub(super) fn one_name(r: &mut Reader) -> io::Result<CString> {
    let buf = r.read_vec(r.available())?;
    let (name, rest) = split_cstr(&buf)?;
    check_component(name)?;
    check_empty(rest)?;
    // The buffer is the name and its NUL (checked above): it becomes the name, without a
    // second allocation and copy.
    CString::from_vec_with_nul(buf).map_err(|_| einval())
}

/// The rest of the request as exactly two name components.
pub(super) fn two_names(r: &mut Reader) -> io::Result<(CString, CString)> {
    let rest = r.read_vec(r.available())?;
    let (a, rest) = split_cstr(&rest)?;
    let (b, rest) = split_cstr(rest)?;
    check_component(a)?;
    check_component(b)?;
    check_empty(rest)?;
    Ok((a.to_owned(), b.to_owned()))
}

/// SYMLINK's payload: the new name (one component), then the target (non-empty, shorter
/// than `PATH_MAX`), and nothing after.
pub(super) fn symlink_names(r: &mut Reader) -> io::Result<(CString, CString)> {
    let rest = r.read_vec(r.available())?;
    let (name, rest) = split_cstr(&rest)?;
    let (target, rest) = split_cstr(rest)?;
    check_component(name)?;
    check_empty(rest)?;
    if target.to_bytes().is_empty() || target.to_bytes().len() >= PATH_MAX {
        return Err(err(libc::ENAMETOOLONG));
    }
    Ok((name.to_owned(), target.to_owned()))
}

/// The rest of the request as exactly one xattr name.
pub(super) fn xattr_name(r: &mut Reader) -> io::Result<CString> {
    let buf = r.read_vec(r.available())?;
    let (name, rest) = split_cstr(&buf)?;
    check_xattr_name(name)?;
    check_empty(rest)?;
    // As in `one_name`: the buffer is exactly the name and its NUL.
    CString::from_vec_with_nul(buf).map_err(|_| einval())
}

/// TMPFILE's placeholder name: the client sends one; it only has to be well formed.
pub(super) fn placeholder_name(r: &mut Reader) -> io::Result<()> {
    let rest = r.read_vec(r.available())?;
    check_empty(split_cstr(&rest)?.1)
}
