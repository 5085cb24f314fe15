//! A migration stream from a hostile or broken source, loaded by a destination daemon: never
//! a panic, and never an inode from outside the shared directory (the harness checks every
//! node id the stream names). One share per process (`share/` and `outside/` next to it).
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use daxfsd::fuzzing;
use libfuzzer_sys::fuzz_target;

fn share() -> &'static PathBuf {
    static DIR: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &DIR.get_or_init(|| {
        let top = tempfile::tempdir().expect("fuzz tempdir");
        let share = fuzzing::migration_world(top.path()).expect("fuzz share");
        (top, share)
    })
    .1
}

fuzz_target!(|data: &[u8]| {
    fuzzing::run_migration_stream(share(), data);
});
