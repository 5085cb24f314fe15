//! Arbitrary virtqueue descriptor chains (addresses, lengths, flags, guest memory contents)
//! through the transport's chain splitting and the server.
#![no_main]

use daxfsd::fuzzing;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    fuzzing::run_chain(data);
});
