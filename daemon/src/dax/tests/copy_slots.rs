//! Copy slots: read-only ranges parked and refilled, refreshed when their file moves,
//! evicted for the budget, and `--dax-copy=auto`.

use super::*;

#[test]
fn copy_slots_park_and_refill_without_a_round_trip() {
    let (w, rec) = copy_window(CopyMode::Always, 8, DEFAULT_MAP_BUDGET);
    let a = data_file(1, 3 * MB2 as usize);
    let b = data_file(2, 3 * MB2 as usize);
    map_at(&w, 7, MB2, MB2, a.as_fd(), MB2, false).unwrap();
    assert_eq!(
        calls(&rec),
        vec!["map 0x200000+0x200000@0x200000 ro"],
        "slot offset = window offset"
    );
    assert_eq!(frontend_read(&rec, MB2, 4096), vec![1u8; 4096]);
    // REMOVEMAPPING parks it: nothing sent.
    w.unmap(MB2, MB2).unwrap();
    assert!(calls(&rec).is_empty());
    let s = w.stats();
    assert_eq!((s.parked, s.regions, s.mapped_bytes), (1, 1, 0), "{s}");
    // Another file's read-only range at the same window offset: refilled in place.
    map_at(&w, 9, MB2, MB2, b.as_fd(), 0, false).unwrap();
    assert!(calls(&rec).is_empty(), "no SHMEM request for a parked slot");
    assert_eq!(
        frontend_read(&rec, MB2, MB2 as usize),
        vec![2u8; MB2 as usize]
    );
    let s = w.stats();
    assert_eq!((s.copies, s.reused, s.parked, s.maps), (1, 1, 0, 2), "{s}");
    // A parked slot of another extent is unmapped before a map over it.
    w.unmap(MB2, MB2).unwrap();
    map_at(&w, 9, MB2, 4096, b.as_fd(), 0, false).unwrap();
    assert_eq!(
        calls(&rec),
        vec!["unmap 0x200000+0x200000", "map 0x200000+0x1000@0x200000 ro"]
    );
    // A device reset forgets parked slots (the frontend dropped them).
    w.unmap(MB2, 4096).unwrap();
    w.reset();
    w.start();
    assert_eq!((w.stats().parked, w.stats().regions), (0, 0));
    map_at(&w, 9, MB2, MB2, b.as_fd(), 0, false).unwrap();
    assert_eq!(calls(&rec), vec!["map 0x200000+0x200000@0x200000 ro"]);
    // DESTROY unmaps parked slots.
    w.unmap(MB2, MB2).unwrap();
    w.end_session();
    assert_eq!(calls(&rec), vec!["unmap 0x200000+0x200000"]);
}

#[test]
fn an_upgrade_turns_a_copy_into_a_direct_mapping() {
    let (w, rec) = copy_window(CopyMode::Always, 8, DEFAULT_MAP_BUDGET);
    let f = data_file(3, MB2 as usize);
    map_at(&w, 7, 0, MB2, f.as_fd(), 0, false).unwrap();
    map_at(&w, 7, 0, MB2, f.as_fd(), 0, true).unwrap();
    assert_eq!(
        calls(&rec),
        vec![
            "map 0x0+0x200000@0x0 ro",
            "unmap 0x0+0x200000",
            "map 0x0+0x200000@0x0 rw"
        ]
    );
    // Stores reach the file.
    rec.fds.lock().unwrap()[&0]
        .write_all_at(b"store", 10)
        .unwrap();
    let mut got = [0u8; 5];
    f.read_exact_at(&mut got, 10).unwrap();
    assert_eq!(&got, b"store");
    // A writable map over a parked slot unmaps the slot first.
    map_at(&w, 7, MB2, MB2, f.as_fd(), 0, false).unwrap();
    w.unmap(MB2, MB2).unwrap();
    calls(&rec);
    map_at(&w, 7, MB2, MB2, f.as_fd(), 0, true).unwrap();
    assert_eq!(
        calls(&rec),
        vec!["unmap 0x200000+0x200000", "map 0x200000+0x200000@0x0 rw"]
    );
    assert_eq!(w.stats().parked, 0);
}

#[test]
fn copies_follow_the_file_at_sync_points_and_zero_past_eof() {
    let (w, rec) = copy_window(CopyMode::Always, 8, DEFAULT_MAP_BUDGET);
    let f = data_file(4, 5000);
    map_at(&w, 7, 0, MB2, f.as_fd(), 0, false).unwrap();
    let got = frontend_read(&rec, 0, 8192);
    assert_eq!(&got[..5000], &[4u8; 5000][..]);
    assert!(got[5000..].iter().all(|&b| b == 0), "zeros past EOF");
    // A host write: seen at the next sync point (size moved).
    f.write_all_at(b"host", 5000).unwrap();
    w.sync(8);
    assert_eq!(
        &frontend_read(&rec, 0, 5004)[5000..],
        &[0u8; 4],
        "other inode"
    );
    w.sync(7);
    assert_eq!(&frontend_read(&rec, 0, 5004)[5000..], b"host");
    // A write through the request path is in the copy whatever the timestamps say.
    f.write_all_at(b"fuse", 0).unwrap();
    w.written(7, 0, 4);
    assert_eq!(&frontend_read(&rec, 0, 4), b"fuse");
    // A request-path write elsewhere in the file re-reads only the copies it overlaps.
    let big = data_file(1, 2 * MB2 as usize);
    map_at(&w, 9, 2 * MB2, MB2, big.as_fd(), 0, false).unwrap();
    map_at(&w, 9, 3 * MB2, MB2, big.as_fd(), MB2, false).unwrap();
    calls(&rec);
    let before = w.stats().recopied;
    big.write_all_at(b"x", MB2 + 5).unwrap();
    w.written(9, MB2 + 5, 1);
    assert_eq!(
        w.stats().recopied,
        before + 1,
        "only the written range re-read"
    );
    assert_eq!(&frontend_read(&rec, 3 * MB2, 6)[5..], b"x");
    // Both copies now hold timestamps of this clock tick, which prove nothing (a host write
    // in the same tick would leave the same ones): sync points re-read them until the clock
    // moved on, then nothing.
    std::thread::sleep(std::time::Duration::from_millis(30));
    w.refresh(9);
    let settled = w.stats().recopied;
    w.refresh(9);
    w.sync(9);
    assert_eq!(
        w.stats().recopied,
        settled,
        "settled timestamps: nothing re-read"
    );
    w.unmap(2 * MB2, 2 * MB2).unwrap();
    // Shrinking zeroes the rest; the periodic pass sees it too.
    f.set_len(2).unwrap();
    w.sync_all();
    assert_eq!(frontend_read(&rec, 0, 4), b"fu\0\0");
    assert!(w.stats().recopied >= 3, "{}", w.stats());
    assert!(calls(&rec).is_empty(), "refreshes send nothing");
}

#[test]
fn the_budget_evicts_parked_slots_oldest_first() {
    // 4 ranges, room for 6 frontend mappings.
    let (w, rec) = copy_window(CopyMode::Always, 4, 6);
    let f = data_file(5, 4 * MB2 as usize);
    for i in 0..4 {
        map_at(&w, 7, i * MB2, MB2, f.as_fd(), i * MB2, false).unwrap();
    }
    for i in 0..4 {
        w.unmap(i * MB2, MB2).unwrap();
    }
    calls(&rec);
    assert_eq!((w.stats().parked, w.stats().regions), (4, 4));
    // A writable mapping of a short file needs 2 mappings plus one in reserve per free
    // range: parked slots make room, oldest first.
    let short = data_file(6, 5000);
    map_at(&w, 8, 0, MB2, short.as_fd(), 0, true).unwrap();
    assert_eq!(
        calls(&rec),
        vec![
            "unmap 0x0+0x200000",
            "unmap 0x200000+0x200000",
            "unmap 0x400000+0x200000",
            "map 0x0+0x1000@0x0 rw",
            "map 0x1000+0x1ff000@0x0 rw"
        ]
    );
    let s = w.stats();
    assert_eq!((s.parked, s.evicted, s.regions), (1, 2, 3), "{s}");
    assert!(s.peak_regions <= 6, "{s}");
}

#[test]
fn auto_copies_only_while_the_window_churns() {
    let (w, rec) = copy_window(CopyMode::Auto, 8, DEFAULT_MAP_BUDGET);
    let f = data_file(7, 8 * MB2 as usize);
    map_at(&w, 7, 0, MB2, f.as_fd(), 0, false).unwrap();
    assert_eq!(calls(&rec), vec!["map 0x0+0x200000@0x0 ro"]);
    assert_eq!(w.stats().copies, 0, "a calm window maps the file");
    // An emptying window is not churn: the guest drops many ranges of a window with room
    // to spare (an evicted inode, dropped caches), then maps again.
    for i in 1..4 {
        map_at(&w, 7, i * MB2, MB2, f.as_fd(), i * MB2, false).unwrap();
    }
    for _ in 0..=crate::dax::copy::CHURN_PER_SECOND {
        for i in 0..4 {
            w.unmap(i * MB2, MB2).unwrap();
        }
        for i in 0..4 {
            map_at(&w, 7, i * MB2, MB2, f.as_fd(), i * MB2, false).unwrap();
        }
    }
    assert_eq!(w.stats().copies, 0, "half a window recycled: {}", w.stats());
    // A full window recycling one range is.
    for i in 4..8 {
        map_at(&w, 7, i * MB2, MB2, f.as_fd(), i * MB2, false).unwrap();
    }
    for _ in 0..=crate::dax::copy::CHURN_PER_SECOND {
        w.unmap(0, MB2).unwrap();
        map_at(&w, 7, 0, MB2, f.as_fd(), 0, false).unwrap();
    }
    assert!(w.stats().copies >= 1, "{}", w.stats());
    let before = rec.calls.lock().unwrap().len();
    w.unmap(0, MB2).unwrap();
    map_at(&w, 7, 0, MB2, f.as_fd(), 0, false).unwrap();
    assert_eq!(rec.calls.lock().unwrap().len(), before, "parked and reused");
    // Calm again (the rate window is 2 s): a map onto a parked slot still refills it
    // within CHURN_LINGER (another file too); a range with no parked slot maps the file.
    std::thread::sleep(Duration::from_millis(2100));
    let g = data_file(9, MB2 as usize);
    w.unmap(0, MB2).unwrap();
    map_at(&w, 8, 0, MB2, g.as_fd(), 0, false).unwrap();
    assert_eq!(
        rec.calls.lock().unwrap().len(),
        before,
        "refilled after the churn"
    );
    assert_eq!(window_read(&rec, 0, 4), vec![9u8; 4]);
    w.unmap(MB2, MB2).unwrap();
    map_at(&w, 7, MB2, MB2, f.as_fd(), MB2, false).unwrap();
    assert_eq!(
        calls(&rec)[before..],
        [
            "unmap 0x200000+0x200000",
            "map 0x200000+0x200000@0x200000 ro"
        ]
    );
    // Off never copies (the default of a window: today's behaviour).
    let (w, rec) = copy_window(CopyMode::Off, 8, DEFAULT_MAP_BUDGET);
    for _ in 0..=crate::dax::copy::CHURN_PER_SECOND {
        map_at(&w, 7, 0, MB2, f.as_fd(), 0, false).unwrap();
        w.unmap(0, MB2).unwrap();
    }
    assert_eq!(w.stats().copies, 0);
    assert_eq!(
        calls(&rec).len(),
        2 * (crate::dax::copy::CHURN_PER_SECOND as usize + 1)
    );
    assert_eq!(
        DaxWindow::<Arc<Rec>>::new(MB2).unwrap().copy_mode(),
        CopyMode::Off
    );
}
