//! Requests served again after the file server died (`--restartable`): a removal or rename
//! that finds its name gone was done by the server that died, and is answered as done; the
//! same request served once keeps its ENOENT.

mod common;

use common::*;
use daxfsd::abi::{opcode as op, *};

#[test]
fn a_removal_served_again_after_a_crash_is_answered_done() {
    let h = Harness::new();
    h.make_file(ROOT, "gone", b"");
    h.mkdir(ROOT, "dir", 0o755).unwrap();
    assert_eq!(h.send(op::UNLINK, ROOT, &[&cname("gone")]).error, 0);
    assert_eq!(h.send(op::RMDIR, ROOT, &[&cname("dir")]).error, 0);
    for (opcode, name) in [(op::UNLINK, "gone"), (op::RMDIR, "dir")] {
        // The same request again, as a server started after a crash serves it.
        let req = h.request(0, 0, opcode, ROOT, &[&cname(name)]);
        h.server
            .note_served_again(read_at::<InHeader>(&req, 0).unique);
        let (_, r) = h.send_raw(req, ROOM);
        assert_eq!(r.error, 0, "{name}: served again, answered done");
        // A request served once that finds nothing: ENOENT as always.
        let r = h.send(opcode, ROOT, &[&cname(name)]);
        assert_eq!(r.error, -libc::ENOENT, "{name}: served once");
    }
}
