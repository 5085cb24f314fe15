//! A direct window taken back by the next file server (`--restartable`, `dax::kept`): what
//! the frontend still maps is known again and nothing is sent for it; what a crash left
//! unsure is unmapped before its range is used again.

use super::pool::Vault;
use super::*;
use crate::dax::kept::Front;

/// A direct window kept with `vault`.
fn kept_direct(vault: &Arc<Vault>) -> (DaxWindow<Arc<Rec>>, Arc<Rec>) {
    let (w, rec) = running(8 * MB2, DEFAULT_MAP_BUDGET);
    w.set_keeper(vault.clone()).unwrap();
    (w, rec)
}

#[test]
fn a_direct_window_with_a_tail_comes_back_from_the_vault_after_a_crash() {
    let vault = Arc::new(Vault::default());
    let (w, rec) = kept_direct(&vault);
    let f = tempfile::tempfile().unwrap();
    f.set_len(MB2 / 2 + 100).unwrap();
    map_at(&w, 7, 0, MB2, f.as_fd(), 0, true).unwrap();
    assert_eq!(
        calls(&rec),
        vec!["map 0x0+0x100000@0x0 rw", "map 0x100000+0x100000@0x0 rw"]
    );
    let tail = rec.fds.lock().unwrap()[&(MB2 / 2)].try_clone().unwrap();
    tail.write_all_at(b"before", 10).unwrap();
    // The server dies; the frontend keeps both mappings. The next one takes them back.
    let (w2, rec2) = running(8 * MB2, DEFAULT_MAP_BUDGET);
    assert_eq!(w2.restore_kept(vault.entries()), 1);
    w2.set_keeper(vault.clone()).unwrap();
    drop(w);
    tail.write_all_at(b"after", 50).unwrap();
    Coherence::sync(&w2, 7);
    let mut got = [0u8; 6];
    f.read_exact_at(&mut got, MB2 / 2 + 10).unwrap();
    assert_eq!(&got, b"before", "a tail store from before the crash");
    f.read_exact_at(&mut got[..5], MB2 / 2 + 50).unwrap();
    assert_eq!(&got[..5], b"after", "a tail store from after it");
    assert_eq!(calls(&rec2), Vec::<String>::new(), "nothing sent again");
    // A remap of the range taken back is UNMAP then MAP of exactly what the frontend holds.
    tail.write_all_at(b"late", 70).unwrap();
    w2.unmap(0, MB2).unwrap();
    assert_eq!(
        calls(&rec2),
        vec!["unmap 0x0+0x100000", "unmap 0x100000+0x100000"]
    );
    f.read_exact_at(&mut got[..4], MB2 / 2 + 70).unwrap();
    assert_eq!(&got[..4], b"late", "written back at REMOVEMAPPING");
    assert_eq!(f.metadata().unwrap().len(), MB2 / 2 + 100, "never extended");
    let left: Vec<Kept> = vault.0.lock().unwrap().keys().copied().collect();
    assert_eq!(left, Vec::<Kept>::new(), "nothing of the range stays kept");
}

#[test]
fn frontend_mappings_a_crash_left_unsure_or_unnamed_are_unmapped_before_reuse() {
    let vault = Arc::new(Vault::default());
    let f = tempfile::tempfile().unwrap();
    f.set_len(4 * MB2).unwrap();
    // Killed between the keep and the SHMEM_MAP (at 0), and between the ack and the keep of
    // the guest mapping (at 2M): no reply named either.
    vault.keep(
        Kept::DaxFront(0),
        &Front::File.meta(MB2, 0, true, false),
        Some(f.as_fd()),
    );
    vault.keep(
        Kept::DaxFront(MB2),
        &Front::File.meta(MB2, 0, false, true),
        Some(f.as_fd()),
    );
    let (w2, rec2) = running(8 * MB2, DEFAULT_MAP_BUDGET);
    assert_eq!(w2.restore_kept(vault.entries()), 0);
    w2.set_keeper(vault.clone()).unwrap();
    // The guest's SETUPMAPPINGs served again: each range is unmapped first (QEMU refuses an
    // unmap of what it never mapped, which is tolerated) then mapped.
    map_at(&w2, 7, 0, MB2, f.as_fd(), 0, true).unwrap();
    map_at(&w2, 7, MB2, MB2, f.as_fd(), MB2, false).unwrap();
    assert_eq!(
        calls(&rec2),
        vec![
            "unmap 0x0+0x200000",
            "map 0x0+0x200000@0x0 rw",
            "unmap 0x200000+0x200000",
            "map 0x200000+0x200000@0x200000 ro"
        ]
    );
    let v = vault.0.lock().unwrap();
    assert!(v.contains_key(&Kept::DaxDirect(0)) && v.contains_key(&Kept::DaxDirect(MB2)));
    let sent = |m| v[&Kept::DaxFront(m)].0[16] & 2 != 0;
    assert!(sent(0) && sent(MB2), "both acknowledged now");
}
