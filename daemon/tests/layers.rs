//! The crate's layers, read from its source as text: every `crate::` path in `daemon/src`
//! names a layer (never a short re-export of `lib.rs`), and only a layer below its own (or
//! its own). A failure names the file, the line and the forbidden arrow.
//!
//! Bottom up: `sys`; `migration` (the stream format and the transfer: streams, not what is
//! in them); `protocol` (wire format, server, file-system trait, migration capability); the
//! file systems `passthrough` and `dax`; `transport` (which never imports `dax`); `host`;
//! `testing` above everything.
//! Unit tests inside a file (`#[cfg(test)] mod tests { .. }`, or a `tests.rs` /
//! `*_tests.rs` file, or any file in a `tests/` folder) may also use `testing`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Each layer (a top folder or file of `daemon/src`) with the layers it may import.
const LAYERS: &[(&str, &[&str])] = &[
    ("sys", &[]),
    ("migration", &["sys"]),
    ("protocol", &["sys", "migration"]),
    ("passthrough", &["sys", "migration", "protocol"]),
    ("dax", &["sys", "migration", "protocol"]),
    // Not `dax`: the window reaches the transport only as a `BackendChannel`, which the host
    // implements for it (host/dax_channel.rs), so neither imports the other.
    (
        "transport",
        &["sys", "migration", "protocol", "passthrough"],
    ),
    (
        "host",
        &[
            "sys",
            "migration",
            "protocol",
            "passthrough",
            "dax",
            "transport",
        ],
    ),
    (
        "testing",
        &[
            "sys",
            "migration",
            "protocol",
            "passthrough",
            "dax",
            "transport",
            "host",
        ],
    ),
];

/// The short names `lib.rs` re-exports for the crate's users, with their layers.
const SHORT: &[(&str, &str)] = &[
    ("caps", "host"),
    ("cli", "host"),
    ("daemon", "host"),
    ("runfiles", "host"),
    ("sandbox", "host"),
    ("seccomp", "host"),
    ("syslog", "host"),
    ("abi", "protocol"),
    ("backing", "protocol"),
    ("filesystem", "protocol"),
    ("iobuf", "protocol"),
    ("mapper", "protocol"),
    ("secctx", "protocol"),
    ("server", "protocol"),
    ("fuzzing", "testing"),
    ("memfs", "testing"),
    ("dev_fuse", "transport"),
    ("fuse_uring", "transport"),
    ("vhost_user", "transport"),
    ("vring_chain", "transport"),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The layer a file of `daemon/src` belongs to (`None`: the crate root, `lib.rs`/`main.rs`).
fn layer_of(rel: &str) -> Option<&str> {
    match rel.split_once('/') {
        Some((top, _)) => Some(top),
        None if rel == "lib.rs" || rel == "main.rs" => None,
        None => Some(rel.trim_end_matches(".rs")),
    }
}

/// Every `crate::NAME` on the line, outside `//` comments.
fn crate_refs(line: &str) -> Vec<&str> {
    let code = line.split("//").next().unwrap_or("");
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().next_back();
        let after = &rest[i + "crate::".len()..];
        let end = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        // `daxfsd_crate::` or `$crate::` are not this crate's paths.
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$') {
            out.push(&after[..end]);
        }
        rest = &after[end..];
    }
    out
}

/// Checks one file's text; returns one message per violation.
fn check(rel: &str, text: &str) -> Vec<String> {
    let layers: BTreeMap<&str, &[&str]> = LAYERS.iter().copied().collect();
    let short: BTreeMap<&str, &str> = SHORT.iter().copied().collect();
    let Some(own) = layer_of(rel) else {
        return Vec::new();
    };
    let Some(allowed) = layers.get(own) else {
        return vec![format!(
            "daemon/src/{rel}: folder `{own}` is in no layer (add it to LAYERS in {})",
            file!()
        )];
    };
    let name = rel.rsplit('/').next().unwrap_or(rel);
    let whole_file_is_test = name == "tests.rs"
        || name.ends_with("_tests.rs")
        || rel.split('/').rev().skip(1).any(|dir| dir == "tests");
    let mut errors = Vec::new();
    let mut in_test_mod = false;
    let mut cfg_test_pending = false;
    for (n, line) in text.lines().enumerate() {
        let lineno = n + 1;
        if line.starts_with("#[cfg(test)]") {
            cfg_test_pending = true;
        } else if cfg_test_pending && !line.starts_with("#[") {
            in_test_mod = line.starts_with("mod ") && line.trim_end().ends_with('{');
            cfg_test_pending = false;
        } else if in_test_mod && line == "}" {
            in_test_mod = false;
        }
        let test_code = whole_file_is_test || in_test_mod;
        for r in crate_refs(line) {
            let target = if layers.contains_key(r) {
                r
            } else if let Some(&l) = short.get(r) {
                errors.push(format!(
                    "daemon/src/{rel}:{lineno}: `crate::{r}` is a short re-export of lib.rs; name its layer: `crate::{l}::{r}`"
                ));
                l
            } else {
                errors.push(format!(
                    "daemon/src/{rel}:{lineno}: `crate::{r}` is no layer of the crate"
                ));
                continue;
            };
            if target == own || allowed.contains(&target) || (test_code && target == "testing") {
                continue;
            }
            errors.push(format!(
                "daemon/src/{rel}:{lineno}: forbidden arrow {own} -> {target} (`crate::{r}`): {own} may import only {allowed:?}"
            ));
        }
    }
    errors
}

#[test]
fn every_import_names_a_layer_below_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    assert!(
        files.len() > 20,
        "found only {} files in {src:?}",
        files.len()
    );
    let mut errors = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
        errors.extend(check(&rel, &std::fs::read_to_string(f).unwrap()));
    }
    assert!(
        errors.is_empty(),
        "{} layer violation(s):\n{}",
        errors.len(),
        errors.join("\n")
    );
}

/// Every top module `lib.rs` declares is a layer of the table, and the other way round.
#[test]
fn the_table_names_every_layer_of_lib_rs() {
    let lib =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let mut declared: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod "))
        .map(|l| l.trim_end_matches(';'))
        .collect();
    declared.sort();
    let mut table: Vec<&str> = LAYERS.iter().map(|(l, _)| *l).collect();
    table.sort();
    assert_eq!(declared, table);
}

/// The checker itself: what it must refuse and what it must let through.
#[test]
fn the_checker_catches_what_it_should() {
    let bad = check(
        "protocol/server.rs",
        "use crate::passthrough::PassthroughFs;\nuse crate::abi::ROOT_ID;\n",
    );
    assert_eq!(bad.len(), 2, "{bad:?}");
    assert!(bad[0].contains("server.rs:1: forbidden arrow protocol -> passthrough"));
    assert!(bad[1].contains("server.rs:2: `crate::abi` is a short re-export"));
    let short_upward = check("migration/mod.rs", "x = crate::server::Server::new();");
    assert!(short_upward
        .iter()
        .any(|e| e.contains("migration -> protocol")));
    // Comments, other crates' and macro paths, and the layer's own modules are fine.
    assert!(check(
        "protocol/server.rs",
        "// crate::host::cli\nuse crate::protocol::abi;\nlet x = $crate::host;\n"
    )
    .is_empty());
    // Unit tests may use `testing`; code after the test module may not.
    let t = "#[cfg(test)]\nmod tests {\n    use crate::testing::memfs::MemFs;\n}\nuse crate::testing::x;\n";
    let e = check("transport/vhost_user.rs", t);
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].contains("vhost_user.rs:5: forbidden arrow transport -> testing"));
    assert!(check("passthrough/migration_tests.rs", "use crate::testing::x;").is_empty());
    assert!(check("newlayer/x.rs", "")
        .iter()
        .any(|e| e.contains("no layer")));
}
