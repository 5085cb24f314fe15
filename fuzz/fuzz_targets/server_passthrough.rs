//! The FUSE server fed arbitrary request sequences, over the passthrough filesystem on a
//! temporary directory (one per process, emptied between inputs).
#![no_main]

use std::sync::OnceLock;

use daxfsd::fuzzing;
use libfuzzer_sys::fuzz_target;

fn share() -> &'static tempfile::TempDir {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("fuzz share tempdir"))
}

fuzz_target!(|data: &[u8]| {
    let dir = share();
    if let Ok(fs) = fuzzing::passthrough_fs(dir.path()) {
        fuzzing::run_input(fs, data);
    }
    fuzzing::empty_dir(dir.path());
});
