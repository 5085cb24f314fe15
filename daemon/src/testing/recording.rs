//! A mapper that records calls instead of mapping anything (server tests, fuzzing).

use std::io;
use std::sync::Mutex;

use crate::protocol::mapper::{MapRequest, Mapper};

/// One call seen by a [`RecordingMapper`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapCall {
    Map {
        moffset: u64,
        len: u64,
        foffset: u64,
        writable: bool,
        /// `(st_dev, st_ino)` of the file that was mapped.
        file: (u64, u64),
    },
    Unmap {
        moffset: u64,
        len: u64,
    },
}

/// Records every call, for tests; fails calls that fall outside its window with `EINVAL`.
#[derive(Debug)]
pub struct RecordingMapper {
    size: u64,
    calls: Mutex<Vec<MapCall>>,
}

impl RecordingMapper {
    pub fn new(size: u64) -> Self {
        RecordingMapper {
            size,
            calls: Mutex::new(Vec::new()),
        }
    }

    /// The calls so far, oldest first.
    pub fn calls(&self) -> Vec<MapCall> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    fn check(&self, moffset: u64, len: u64) -> io::Result<()> {
        match moffset.checked_add(len) {
            Some(end) if len > 0 && end <= self.size => Ok(()),
            _ => Err(io::Error::from_raw_os_error(libc::EINVAL)),
        }
    }

    fn push(&self, call: MapCall) {
        if let Ok(mut c) = self.calls.lock() {
            c.push(call);
        }
    }
}

impl Mapper for RecordingMapper {
    fn window_size(&self) -> u64 {
        self.size
    }

    fn map(&self, req: &MapRequest<'_>) -> io::Result<()> {
        self.check(req.moffset, req.len)?;
        let st = crate::sys::fstat(req.fd)?;
        self.push(MapCall::Map {
            moffset: req.moffset,
            len: req.len,
            foffset: req.foffset,
            writable: req.writable,
            file: (st.st_dev, st.st_ino),
        });
        Ok(())
    }

    fn unmap(&self, moffset: u64, len: u64) -> io::Result<()> {
        self.check(moffset, len)?;
        self.push(MapCall::Unmap { moffset, len });
        Ok(())
    }
}
