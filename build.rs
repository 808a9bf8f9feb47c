//! Gives the shared library its SONAME, `libringfeed.so.<MAJOR>` with MAJOR
//! the crate's major version, so a program linked against it records that
//! name and `scripts/install.sh` installs the versioned file with the
//! `.so.<MAJOR>` and `.so` links beside it. While the crate is 0.x every
//! release is `libringfeed.so.0`; docs/decisions.md ("Packaging") says why.
//!
//! Only the cdylib gets the flag: the rlib and the staticlib are not linked
//! here, and the CLI links the rlib.
//!
//! A program linked against the build tree (`-Ltarget/release -lringfeed`)
//! records that SONAME and looks for a file of that name when it starts;
//! cargo makes only `libringfeed.so`. So the profile directory gets the
//! link `libringfeed.so.<MAJOR>` -> `libringfeed.so` here, before the
//! library is linked (a dangling link until then), and such a program
//! runs as built.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let major = env!("CARGO_PKG_VERSION_MAJOR");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    // -soname is an ELF linker flag; the library is Linux-only (io_uring).
    if os == "linux" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libringfeed.so.{major}");
        soname_link(major);
    }
}

/// `<profile dir>/libringfeed.so.<major>` -> `libringfeed.so`. The
/// profile directory is OUT_DIR's third parent
/// (`target/<profile>/build/<crate>-<hash>/out`, also under a target
/// triple); a layout that is not that one gets no link, and a warning.
fn soname_link(major: &str) {
    let Some(out) = std::env::var_os("OUT_DIR") else {
        return;
    };
    let out = std::path::PathBuf::from(out);
    let Some(profile) = out.ancestors().nth(3) else {
        return;
    };
    if out
        .parent()
        .and_then(|p| p.parent())
        .and_then(|p| p.file_name())
        != Some("build".as_ref())
    {
        println!(
            "cargo:warning=unexpected OUT_DIR layout ({}): no libringfeed.so.{major} link made",
            out.display()
        );
        return;
    }
    let link = profile.join(format!("libringfeed.so.{major}"));
    match std::fs::read_link(&link) {
        Ok(to) if to == std::path::Path::new("libringfeed.so") => {}
        _ => {
            let _ = std::fs::remove_file(&link);
            if let Err(e) = std::os::unix::fs::symlink("libringfeed.so", &link) {
                println!("cargo:warning=cannot link {}: {e}", link.display());
            }
        }
    }
}
