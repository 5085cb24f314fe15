//! The FUSE server fed arbitrary request sequences, over the in-memory filesystem with a
//! recording DAX mapper.
#![no_main]

use daxfsd::{fuzzing, memfs::MemFs};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(fs) = MemFs::new() {
        fuzzing::run_input(fs, data);
    }
});
