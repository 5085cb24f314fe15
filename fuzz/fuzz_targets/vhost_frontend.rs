//! A hostile or buggy frontend (VMM) on the vhost-user socket: arbitrary bytes as one
//! connection's messages, through the `vhost` crate's parsing into the daemon's backend.
#![no_main]

use daxfsd::testing::frontend;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    frontend::run_frontend(data);
});
