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
//!
//! It also says what the JPEG decoder's build got (`jpeg_simd`): the
//! library's code knows it as `cfg(ringfeed_jpeg_simd)`, and a build
//! without SIMD where it matters is a warning.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    jpeg_simd();
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

/// Whether libjpeg-turbo (`mozjpeg-sys`, whose build ran before this one)
/// got its SIMD code: that build writes `#define WITH_SIMD 1` into the
/// `jconfig.h` it compiles with, and exports that header's directory as
/// `DEP_JPEG_INCLUDE` (its `links = "jpeg"`), only when it assembled or
/// compiled the SIMD code: on x86 only where `nasm -v` ran. Cargo runs
/// this script again whenever that build ran again.
fn jpeg_simd() {
    println!("cargo::rustc-check-cfg=cfg(ringfeed_jpeg_simd)");
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let Some(dirs) = std::env::var_os("DEP_JPEG_INCLUDE") else {
        println!(
            "cargo:warning=mozjpeg-sys exported no DEP_JPEG_INCLUDE: cannot tell whether its JPEG decoder has SIMD"
        );
        return;
    };
    let simd = std::env::split_paths(&dirs).any(|dir| {
        std::fs::read_to_string(dir.join("jconfig.h")).is_ok_and(|h| {
            h.lines()
                .any(|l| l.split_whitespace().eq(["#define", "WITH_SIMD", "1"]))
        })
    });
    if simd {
        println!("cargo:rustc-cfg=ringfeed_jpeg_simd");
    } else if arch == "x86_64" || arch == "x86" {
        println!(
            "cargo:warning=the JPEG decoder (libjpeg-turbo) was built without SIMD: \
             nasm was not found on PATH, so the image pipeline decodes JPEG slower; \
             install nasm and rebuild (`cargo clean -p mozjpeg-sys` first) for the SIMD build"
        );
    }
    // libjpeg's fatal errors unwind to the decoder's catch (src/image/jpeg.rs).
    if std::env::var("CARGO_CFG_PANIC").as_deref() == Ok("abort") {
        println!(
            "cargo:warning=built with panic=abort: a corrupt JPEG then aborts the process \
             instead of failing its sample"
        );
    }
}
