//! Writes the fuzz seed corpus: one valid request per opcode (plus request sequences) for
//! the server targets, the same requests wrapped in descriptor chains for the chain target
//! (each also as a pool thread serves it),
//! migration streams (real exports, hostile ones) for the migration-stream target, and
//! frontend connections (a QEMU-like handshake and hostile variations) for vhost_frontend.
//! `cargo run -p daxfsd --features fuzzing --example fuzz_seeds -- fuzz/seeds`

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let out = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "fuzz/seeds".into()),
    );
    let mut n = 0;
    for (name, input) in daxfsd::fuzzing::seeds() {
        for target in ["server_memfs", "server_passthrough"] {
            let dir = out.join(target);
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join(&name), &input)?;
        }
        let dir = out.join("descriptor_chain");
        std::fs::create_dir_all(&dir)?;
        for rec in daxfsd::fuzzing::records(&input).iter().take(1) {
            let chain = daxfsd::fuzzing::chain_input(rec.bytes);
            std::fs::write(dir.join(&name), &chain)?;
            // The same chain served as a pool thread serves it (bit 3 of the count byte).
            let mut pooled = chain;
            pooled[0] |= 8;
            std::fs::write(dir.join(format!("{name}.pooled")), pooled)?;
        }
        n += 1;
    }
    // The migration-stream target: real exports of its share layout, and hostile streams.
    let top = tempfile::tempdir()?;
    let dir = out.join("migration_stream");
    std::fs::create_dir_all(&dir)?;
    for (name, input) in daxfsd::fuzzing::migration_seeds(top.path())? {
        std::fs::write(dir.join(name), input)?;
    }
    // The vhost-user control channel: connections a frontend could open.
    let dir = out.join("vhost_frontend");
    std::fs::create_dir_all(&dir)?;
    for (name, input) in daxfsd::testing::frontend::frontend_seeds() {
        std::fs::write(dir.join(name), input)?;
    }
    println!("wrote {n} seeds per target under {}", out.display());
    Ok(())
}
