//! Gives the shared library its SONAME, `libringfeed.so.<MAJOR>` with MAJOR
//! the crate's major version, so a program linked against it records that
//! name and `scripts/install.sh` installs the versioned file with the
//! `.so.<MAJOR>` and `.so` links beside it. While the crate is 0.x every
//! release is `libringfeed.so.0`; docs/decisions.md ("Packaging") says why.
//!
//! Only the cdylib gets the flag: the rlib and the staticlib are not linked
//! here, and the CLI links the rlib.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let major = env!("CARGO_PKG_VERSION_MAJOR");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    // -soname is an ELF linker flag; the library is Linux-only (io_uring).
    if os == "linux" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libringfeed.so.{major}");
    }
}
