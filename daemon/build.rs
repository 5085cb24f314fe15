//! Sets `DAXFSD_VERSION`: the package version, with `+ID` when `DAXFSD_BUILD_ID=ID` is set.
fn main() {
    println!("cargo:rerun-if-env-changed=DAXFSD_BUILD_ID");
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    let full = match std::env::var("DAXFSD_BUILD_ID") {
        Ok(id) if !id.is_empty() => format!("{version}+{id}"),
        _ => version,
    };
    println!("cargo:rustc-env=DAXFSD_VERSION={full}");
}
