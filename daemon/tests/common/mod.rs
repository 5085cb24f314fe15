//! Test harness: a `Server<PassthroughFs>` over a temporary directory, driven through
//! in-memory request/reply buffers exactly as a transport would.
//!
//! Layout: `<tmp>/share` is the shared directory, `<tmp>/outside` a sentinel directory
//! next to it (with a file `secret`) that no request may touch.

#![allow(dead_code)] // each test binary uses a different subset

pub mod mount;

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use daxfsd::abi::{opcode as op, *};
use daxfsd::iobuf::{Reader, Writer};
use daxfsd::mapper::{Mapper, NoMapper};
use daxfsd::passthrough::{Config, FileHandleMode, PassthroughFs};
use daxfsd::server::{Handled, Server, ServerOptions};
use daxfsd::testing::recording::{MapCall, RecordingMapper};
use vm_memory::{ByteValued, VolatileSlice};

pub const ROOT: u64 = 1;
/// Reply room given to ordinary requests.
pub const ROOM: usize = 64 * 1024;
/// DAX window of the recording mapper.
pub const WINDOW: u64 = 64 << 20;
/// Largest READ/WRITE the server negotiates by default (256 pages).
pub const MAX_IO: u32 = 256 * 4096;

/// `s` as a NUL-terminated name.
pub fn cname(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// Raw bytes of a wire struct.
pub fn raw<T: ByteValued>(v: &T) -> Vec<u8> {
    v.as_slice().to_vec()
}

/// Reads a wire struct at `off` of `buf`.
pub fn read_at<T: ByteValued + Default>(buf: &[u8], off: usize) -> T {
    let mut v = T::default();
    let n = std::mem::size_of::<T>();
    v.as_mut_slice().copy_from_slice(&buf[off..off + n]);
    v
}

/// A parsed reply.
#[derive(Debug)]
pub struct Reply {
    /// False when the server sent nothing back (FORGET, INTERRUPT, dropped requests).
    pub replied: bool,
    /// `OutHeader.error` (0 or a negative errno).
    pub error: i32,
    pub unique: u64,
    pub body: Vec<u8>,
}

impl Reply {
    /// `Ok(body)` or `Err(errno)`.
    pub fn result(&self) -> Result<&[u8], i32> {
        assert!(self.replied, "expected a reply");
        if self.error == 0 {
            Ok(&self.body)
        } else {
            assert!(self.body.is_empty(), "error reply with a body");
            Err(-self.error)
        }
    }

    /// The errno of an error reply (panics on success).
    pub fn errno(&self) -> i32 {
        match self.result() {
            Err(e) => e,
            Ok(b) => panic!("expected an error, got a {}-byte success reply", b.len()),
        }
    }

    /// The body as one wire struct (panics on error).
    pub fn obj<T: ByteValued + Default>(&self) -> T {
        let body = self.result().unwrap_or_else(|e| panic!("errno {e}"));
        assert_eq!(body.len(), std::mem::size_of::<T>(), "reply body size");
        read_at(body, 0)
    }
}

/// One READDIR(PLUS) entry.
#[derive(Debug, Clone)]
pub struct DirItem {
    pub name: Vec<u8>,
    pub ino: u64,
    pub off: u64,
    pub typ: u32,
    pub entry: Option<EntryOut>,
}

impl DirItem {
    pub fn name(&self) -> &str {
        std::str::from_utf8(&self.name).unwrap()
    }
}

/// Which mapper the server gets.
pub enum MapperKind {
    Recording,
    None,
}

pub struct Harness {
    pub tmp: tempfile::TempDir,
    pub share: PathBuf,
    pub outside: PathBuf,
    pub server: Server<PassthroughFs>,
    pub recorder: Arc<RecordingMapper>,
    unique: AtomicU64,
}

impl Harness {
    /// Default config plus xattrs, a recording mapper, INIT done.
    pub fn new() -> Self {
        Self::with(|_| {})
    }

    /// Like [`Harness::new`] with a config tweak.
    pub fn with(tweak: impl FnOnce(&mut Config)) -> Self {
        let h = Self::uninit(tweak, MapperKind::Recording);
        h.init();
        h
    }

    /// [`Harness::new`] with the share in a temporary directory under `base` (for a test
    /// that needs the host file system of the build directory, not of $TMPDIR).
    pub fn new_in(base: &Path) -> Self {
        let h = Self::uninit_in(base, |_| {}, MapperKind::Recording);
        h.init();
        h
    }

    /// A server that has not seen INIT yet.
    pub fn uninit(tweak: impl FnOnce(&mut Config), mapper: MapperKind) -> Self {
        Self::uninit_in(&std::env::temp_dir(), tweak, mapper)
    }

    fn uninit_in(base: &Path, tweak: impl FnOnce(&mut Config), mapper: MapperKind) -> Self {
        let tmp = tempfile::tempdir_in(base).unwrap();
        let share = tmp.path().join("share");
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&share).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret"), b"s3cret").unwrap();
        let mut cfg = Config {
            root_dir: share.clone(),
            xattr: true,
            ..Default::default()
        };
        // DAXFSD_TEST_FILE_HANDLES=prefer|mandatory runs a suite with inodes kept as file
        // handles (needs root: CAP_DAC_READ_SEARCH).
        match std::env::var("DAXFSD_TEST_FILE_HANDLES").as_deref() {
            Ok("prefer") => cfg.inode_file_handles = FileHandleMode::Prefer,
            Ok("mandatory") => cfg.inode_file_handles = FileHandleMode::Mandatory,
            Ok("") | Ok("never") | Err(_) => {}
            Ok(other) => panic!("DAXFSD_TEST_FILE_HANDLES={other:?}: never, prefer or mandatory"),
        }
        tweak(&mut cfg);
        let recorder = Arc::new(RecordingMapper::new(WINDOW));
        let mapper: Box<dyn Mapper> = match mapper {
            MapperKind::Recording => Box::new(recorder.clone()),
            MapperKind::None => Box::new(NoMapper),
        };
        let fs = PassthroughFs::new(cfg).unwrap();
        let server = Server::new(fs, mapper, ServerOptions::default());
        Harness {
            tmp,
            share,
            outside,
            server,
            recorder,
            unique: AtomicU64::new(1),
        }
    }

    pub fn fs(&self) -> &PassthroughFs {
        self.server.fs()
    }

    /// Host path of `rel` inside the share.
    pub fn host(&self, rel: &str) -> PathBuf {
        self.share.join(rel)
    }

    pub fn mapper_calls(&self) -> Vec<MapCall> {
        self.recorder.calls()
    }

    /// INIT offering every flag; returns the server's answer.
    pub fn init(&self) -> InitOut {
        let init = InitIn {
            major: KERNEL_VERSION,
            minor: KERNEL_MINOR_VERSION,
            max_readahead: 1 << 20,
            flags: u32::MAX,
            flags2: u32::MAX,
            ..Default::default()
        };
        self.send(op::INIT, 0, &[&raw(&init)]).obj()
    }

    /// Builds a request (header `len` = real size) from the caller `uid`/`gid`.
    pub fn request(&self, uid: u32, gid: u32, opcode: u32, nodeid: u64, args: &[&[u8]]) -> Vec<u8> {
        let body: usize = args.iter().map(|a| a.len()).sum();
        let hdr = InHeader {
            len: (std::mem::size_of::<InHeader>() + body) as u32,
            opcode,
            unique: self.unique.fetch_add(1, Ordering::Relaxed),
            nodeid,
            uid,
            gid,
            pid: 42,
            ..Default::default()
        };
        let mut v = raw(&hdr);
        for a in args {
            v.extend_from_slice(a);
        }
        v
    }

    /// Sends raw request bytes with `room` bytes of reply space (0: no writable buffer).
    pub fn send_raw(&self, mut req: Vec<u8>, room: usize) -> (io::Result<Handled>, Reply) {
        let mut reply = vec![0u8; room];
        let res = {
            let r = Reader::new(vec![VolatileSlice::from(req.as_mut_slice())]);
            let w =
                (room > 0).then(|| Writer::new(vec![VolatileSlice::from(reply.as_mut_slice())]));
            self.server.handle(r, w)
        };
        let written = res.as_ref().map_or(0, |h| h.written);
        let parsed = if written == 0 {
            Reply {
                replied: false,
                error: 0,
                unique: 0,
                body: Vec::new(),
            }
        } else {
            let out: OutHeader = read_at(&reply, 0);
            assert_eq!(
                out.len as usize, written,
                "OutHeader.len matches bytes written"
            );
            Reply {
                replied: true,
                error: out.error,
                unique: out.unique,
                body: reply[std::mem::size_of::<OutHeader>()..written].to_vec(),
            }
        };
        (res, parsed)
    }

    pub fn send(&self, opcode: u32, nodeid: u64, args: &[&[u8]]) -> Reply {
        self.send_as(0, 0, opcode, nodeid, args)
    }

    pub fn send_as(&self, uid: u32, gid: u32, opcode: u32, nodeid: u64, args: &[&[u8]]) -> Reply {
        let req = self.request(uid, gid, opcode, nodeid, args);
        let unique = read_at::<InHeader>(&req, 0).unique;
        let (_, reply) = self.send_raw(req, ROOM);
        if reply.replied {
            assert_eq!(reply.unique, unique, "reply carries the request's unique");
        }
        reply
    }

    // ---- one helper per common request; errors come back as Err(errno) ----

    pub fn lookup(&self, parent: u64, name: &str) -> Result<EntryOut, i32> {
        let r = self.send(op::LOOKUP, parent, &[&cname(name)]);
        r.result().map(|_| r.obj())
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr, i32> {
        let r = self.send(op::GETATTR, ino, &[&raw(&GetattrIn::default())]);
        r.result().map(|_| r.obj::<AttrOut>().attr)
    }

    pub fn setattr(&self, ino: u64, a: &SetattrIn) -> Result<Attr, i32> {
        let r = self.send(op::SETATTR, ino, &[&raw(a)]);
        r.result().map(|_| r.obj::<AttrOut>().attr)
    }

    pub fn mkdir(&self, parent: u64, name: &str, mode: u32) -> Result<EntryOut, i32> {
        self.mkdir_as(0, 0, parent, name, mode, 0)
    }

    pub fn mkdir_as(
        &self,
        uid: u32,
        gid: u32,
        parent: u64,
        name: &str,
        mode: u32,
        umask: u32,
    ) -> Result<EntryOut, i32> {
        let a = MkdirIn { mode, umask };
        let r = self.send_as(uid, gid, op::MKDIR, parent, &[&raw(&a), &cname(name)]);
        r.result().map(|_| r.obj())
    }

    pub fn mknod(&self, parent: u64, name: &str, mode: u32, rdev: u32) -> Result<EntryOut, i32> {
        let a = MknodIn {
            mode,
            rdev,
            umask: 0,
            padding: 0,
        };
        let r = self.send(op::MKNOD, parent, &[&raw(&a), &cname(name)]);
        r.result().map(|_| r.obj())
    }

    pub fn symlink(&self, parent: u64, name: &str, target: &str) -> Result<EntryOut, i32> {
        let r = self.send(op::SYMLINK, parent, &[&cname(name), &cname(target)]);
        r.result().map(|_| r.obj())
    }

    pub fn create(
        &self,
        parent: u64,
        name: &str,
        mode: u32,
        flags: i32,
    ) -> Result<(EntryOut, OpenOut), i32> {
        self.create_as(0, 0, parent, name, mode, flags)
    }

    pub fn create_as(
        &self,
        uid: u32,
        gid: u32,
        parent: u64,
        name: &str,
        mode: u32,
        flags: i32,
    ) -> Result<(EntryOut, OpenOut), i32> {
        let a = CreateIn {
            flags: flags as u32,
            mode: libc::S_IFREG | mode,
            umask: 0,
            open_flags: 0,
        };
        let r = self.send_as(uid, gid, op::CREATE, parent, &[&raw(&a), &cname(name)]);
        let body = r.result()?;
        assert_eq!(body.len(), 128 + 16);
        Ok((read_at(body, 0), read_at(body, 128)))
    }

    pub fn open(&self, ino: u64, flags: i32) -> Result<OpenOut, i32> {
        let a = OpenIn {
            flags: flags as u32,
            open_flags: 0,
        };
        let r = self.send(op::OPEN, ino, &[&raw(&a)]);
        r.result().map(|_| r.obj())
    }

    pub fn read(&self, ino: u64, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, i32> {
        let a = ReadIn {
            fh,
            offset,
            size,
            ..Default::default()
        };
        let req = self.request(0, 0, op::READ, ino, &[&raw(&a)]);
        let (_, r) = self.send_raw(req, size as usize + 16);
        r.result().map(|b| b.to_vec())
    }

    pub fn write(&self, ino: u64, fh: u64, offset: u64, data: &[u8]) -> Result<u32, i32> {
        self.write_flags(ino, fh, offset, data, 0)
    }

    pub fn write_flags(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
        write_flags: u32,
    ) -> Result<u32, i32> {
        let a = WriteIn {
            fh,
            offset,
            size: data.len() as u32,
            write_flags,
            ..Default::default()
        };
        let r = self.send(op::WRITE, ino, &[&raw(&a), data]);
        r.result().map(|_| r.obj::<WriteOut>().size)
    }

    pub fn release(&self, ino: u64, fh: u64) -> Result<(), i32> {
        self.release_op(op::RELEASE, ino, fh, 0)
    }

    pub fn release_op(
        &self,
        opcode: u32,
        ino: u64,
        fh: u64,
        release_flags: u32,
    ) -> Result<(), i32> {
        let a = ReleaseIn {
            fh,
            release_flags,
            ..Default::default()
        };
        self.send(opcode, ino, &[&raw(&a)]).result().map(drop)
    }

    pub fn opendir(&self, ino: u64) -> Result<OpenOut, i32> {
        let r = self.send(op::OPENDIR, ino, &[&raw(&OpenIn::default())]);
        r.result().map(|_| r.obj())
    }

    pub fn releasedir(&self, ino: u64, fh: u64) -> Result<(), i32> {
        self.release_op(op::RELEASEDIR, ino, fh, 0)
    }

    /// One READDIR / READDIRPLUS request.
    pub fn readdir(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
        plus: bool,
    ) -> Result<Vec<DirItem>, i32> {
        let a = ReadIn {
            fh,
            offset,
            size,
            ..Default::default()
        };
        let opcode = if plus { op::READDIRPLUS } else { op::READDIR };
        let r = self.send(opcode, ino, &[&raw(&a)]);
        let body = r.result()?;
        Ok(parse_dirents(body, plus))
    }

    /// Every entry of directory `ino`, READDIR(PLUS) after READDIR(PLUS) of `size` bytes.
    pub fn list_dir(&self, ino: u64, size: u32, plus: bool) -> Vec<DirItem> {
        let fh = self.opendir(ino).unwrap().fh;
        let mut all = Vec::new();
        let mut off = 0;
        loop {
            let items = self.readdir(ino, fh, off, size, plus).unwrap();
            let Some(last) = items.last() else { break };
            off = last.off;
            all.extend(items);
        }
        self.releasedir(ino, fh).unwrap();
        all
    }

    pub fn forget(&self, ino: u64, n: u64) {
        let r = self.send(op::FORGET, ino, &[&raw(&ForgetIn { nlookup: n })]);
        assert!(!r.replied, "FORGET never gets a reply");
    }

    /// Creates `name` (mode 0644) with `data` through the server; returns its nodeid.
    pub fn make_file(&self, parent: u64, name: &str, data: &[u8]) -> u64 {
        let (e, o) = self.create(parent, name, 0o644, libc::O_RDWR).unwrap();
        if !data.is_empty() {
            assert_eq!(
                self.write(e.nodeid, o.fh, 0, data).unwrap() as usize,
                data.len()
            );
        }
        self.release(e.nodeid, o.fh).unwrap();
        e.nodeid
    }

    /// Asserts the server still answers: LOOKUP of a file created for the purpose.
    pub fn assert_alive(&self) {
        if self.lookup(ROOT, "alive").is_err() {
            std::fs::write(self.host("alive"), b"").unwrap();
        }
        let e = self
            .lookup(ROOT, "alive")
            .expect("server still serves LOOKUP");
        assert_eq!(e.attr.ino, host_ino(&self.host("alive")));
    }

    /// Contents of the sentinel directory: names, sizes, mtimes, contents, plus its own mtime.
    pub fn outside_snapshot(&self) -> Vec<(String, u64, i64, i64, Vec<u8>)> {
        snapshot(&self.outside)
    }
}

fn snapshot(dir: &Path) -> Vec<(String, u64, i64, i64, Vec<u8>)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let md = std::fs::symlink_metadata(dir).unwrap();
    out.push((
        ".".to_string(),
        md.size(),
        md.mtime(),
        md.mtime_nsec(),
        Vec::new(),
    ));
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    for p in names {
        let md = std::fs::symlink_metadata(&p).unwrap();
        let data = if md.is_file() {
            std::fs::read(&p).unwrap()
        } else {
            Vec::new()
        };
        out.push((
            p.file_name().unwrap().to_string_lossy().into_owned(),
            md.size(),
            md.mtime(),
            md.mtime_nsec(),
            data,
        ));
    }
    out
}

/// Parses a READDIR(PLUS) reply body.
pub fn parse_dirents(body: &[u8], plus: bool) -> Vec<DirItem> {
    let mut items = Vec::new();
    let mut pos = 0;
    let fixed = if plus { 152 } else { 24 };
    while pos < body.len() {
        let (entry, d): (Option<EntryOut>, Dirent) = if plus {
            let p: DirentPlus = read_at(body, pos);
            let e = (p.entry_out.nodeid != 0).then_some(p.entry_out);
            (e, p.dirent)
        } else {
            (None, read_at(body, pos))
        };
        let name = body[pos + fixed..pos + fixed + d.namelen as usize].to_vec();
        items.push(DirItem {
            name,
            ino: d.ino,
            off: d.off,
            typ: d.typ,
            entry,
        });
        pos += (fixed + d.namelen as usize + 7) & !7;
    }
    assert_eq!(pos, body.len(), "dirents fill the reply exactly");
    items
}

pub fn host_ino(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p).unwrap().ino()
}

pub fn host_mode(p: &Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p).unwrap().mode()
}

pub fn host_owner(p: &Path) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::symlink_metadata(p).unwrap();
    (md.uid(), md.gid())
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// `lgetxattr` on a host path (does not follow a final symlink).
pub fn host_getxattr(p: &Path, name: &str) -> Result<Vec<u8>, i32> {
    let (path, name) = (cpath(p), CString::new(name).unwrap());
    let mut buf = vec![0u8; 65536];
    // SAFETY: both strings are NUL-terminated and `buf` is writable for its length.
    let n = unsafe {
        libc::lgetxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// `lsetxattr` on a host path.
pub fn host_setxattr(p: &Path, name: &str, value: &[u8]) {
    let (path, name) = (cpath(p), CString::new(name).unwrap());
    // SAFETY: both strings are NUL-terminated and `value` is readable for its length.
    let ret = unsafe {
        libc::lsetxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(ret, 0, "lsetxattr: {}", io::Error::last_os_error());
}

/// `mkfifo` on a host path.
pub fn host_mkfifo(p: &Path) {
    let path = cpath(p);
    // SAFETY: `path` is NUL-terminated.
    let ret = unsafe { libc::mkfifo(path.as_ptr(), 0o644) };
    assert_eq!(ret, 0, "mkfifo: {}", io::Error::last_os_error());
}

/// Host descriptors (in `/proc/self/fd`) that point at `p`, with their `fdinfo` flags.
pub fn host_fds_on(p: &Path) -> Vec<u32> {
    let mut flags = Vec::new();
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        if std::fs::read_link(e.path()).ok().as_deref() == Some(p) {
            let info = std::fs::read_to_string(Path::new("/proc/self/fdinfo").join(e.file_name()));
            if let Ok(info) = info {
                for line in info.lines() {
                    if let Some(v) = line.strip_prefix("flags:") {
                        flags.push(u32::from_str_radix(v.trim(), 8).unwrap());
                    }
                }
            }
        }
    }
    flags
}

/// Number of open descriptors of this process.
pub fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// A `SetattrIn` with only `valid` set.
pub fn setattr_in(valid: u32) -> SetattrIn {
    SetattrIn {
        valid,
        ..Default::default()
    }
}
