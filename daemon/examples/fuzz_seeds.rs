//! Writes the fuzz seed corpus: one valid request per opcode (plus request sequences) for
//! the server targets, and the same requests wrapped in descriptor chains for the chain
//! target. `cargo run -p daxfsd --features fuzzing --example fuzz_seeds -- fuzz/seeds`

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
            std::fs::write(dir.join(&name), daxfsd::fuzzing::chain_input(rec.bytes))?;
        }
        n += 1;
    }
    println!("wrote {n} seeds per target under {}", out.display());
    Ok(())
}
