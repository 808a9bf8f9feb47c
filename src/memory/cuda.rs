//! GPU-ready memory: the arena's mapping registered with the CUDA runtime
//! (`cudaHostRegister`), so host-to-device copies from it are DMA transfers
//! from pinned pages instead of staged copies through the driver's own
//! pinned buffer.
//!
//! The runtime is loaded at run time (`dlopen`), never linked: the library
//! must load and run on machines without CUDA, and a trainer that already
//! loaded a runtime (PyTorch ships its own `libcudart`) should share it, not
//! get a second one. A runtime the process already holds is preferred
//! (`RTLD_NOLOAD`), then the usual names are looked up; `RINGFEED_CUDART`
//! names a file that replaces that search. A failure is a `String` with the
//! reason (`dlerror`'s text, or CUDA's error string), for the caller to
//! report or raise; nothing here panics.
//!
//! A loaded runtime is never unloaded (`dlclose`): registrations refer to it
//! until they drop, and CUDA's runtime does not expect to be unloaded.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::path::Path;
use std::sync::OnceLock;

/// The file names tried, in order, when `RINGFEED_CUDART` is not set: the
/// development link, then the sonames of CUDA 12 and 11.
const NAMES: &[&str] = &["libcudart.so", "libcudart.so.12", "libcudart.so.11.0"];

/// The environment variable naming the runtime file to load instead.
pub const RUNTIME_ENV: &str = "RINGFEED_CUDART";

/// `cudaHostRegisterPortable`: the pages count as pinned in every CUDA
/// context of the process, not only the one current at registration, so a
/// trainer that selects its device after the loader opens still copies by DMA.
const HOST_REGISTER_PORTABLE: c_uint = 1;
/// `cudaHostRegisterReadOnly` (CUDA 11.1): the device only reads the pages.
/// Needed to pin a read-only mapping (pinning otherwise asks for write
/// access to every page, and the kernel refuses it).
const HOST_REGISTER_READ_ONLY: c_uint = 8;

type RegisterFn = unsafe extern "C" fn(*mut c_void, usize, c_uint) -> c_int;
type UnregisterFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type ErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;

/// A loaded CUDA runtime: the three entry points this module calls.
pub struct Runtime {
    /// Where it was found, for messages.
    name: String,
    register: RegisterFn,
    unregister: UnregisterFn,
    error_string: ErrorStringFn,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("name", &self.name).finish()
    }
}

/// The runtime of the default lookup (`RINGFEED_CUDART`, else [`NAMES`]),
/// loaded on the first call; every later call returns the same outcome.
pub fn runtime() -> Result<&'static Runtime, String> {
    static DEFAULT: OnceLock<Result<&'static Runtime, String>> = OnceLock::new();
    #[cfg(test)]
    if let Some(rt) = test_override::get() {
        return rt;
    }
    DEFAULT
        .get_or_init(|| match std::env::var_os(RUNTIME_ENV) {
            Some(path) if !path.is_empty() => Runtime::load(Path::new(&path)),
            _ => Runtime::search().map(leak),
        })
        .clone()
}

/// Registers `len` bytes at `ptr` with the default runtime ([`runtime`]).
pub fn register(ptr: *mut u8, len: usize, read_only: bool) -> Result<Registration, String> {
    runtime()?.register(ptr, len, read_only)
}

impl Runtime {
    /// Loads the runtime in the file at `path` (a name without a slash is
    /// looked up as `dlopen` does). The runtime is never unloaded: the
    /// value is leaked so registrations may refer to it for ever.
    pub fn load(path: &Path) -> Result<&'static Runtime, String> {
        Runtime::open(path.as_os_str().as_encoded_bytes(), 0).map(leak)
    }

    /// The first of [`NAMES`] the process already holds, else the first
    /// that loads.
    fn search() -> Result<Runtime, String> {
        for name in NAMES {
            if let Ok(rt) = Runtime::open(name.as_bytes(), libc::RTLD_NOLOAD) {
                return Ok(rt);
            }
        }
        let (mut absent, mut why) = (Vec::new(), Vec::new());
        for name in NAMES {
            match Runtime::open(name.as_bytes(), 0) {
                Ok(rt) => return Ok(rt),
                // The usual case, said once for all names.
                Err(e)
                    if e.ends_with("cannot open shared object file: No such file or directory") =>
                {
                    absent.push(*name)
                }
                Err(e) => why.push(e),
            }
        }
        if !absent.is_empty() {
            why.insert(
                0,
                format!("{}: not on the library search path", absent.join(", ")),
            );
        }
        Err(why.join("; "))
    }

    /// `dlopen(name, RTLD_NOW | RTLD_LOCAL | extra)` and the entry points.
    fn open(name: &[u8], extra: c_int) -> Result<Runtime, String> {
        let shown = String::from_utf8_lossy(name).into_owned();
        let c_name = CString::new(name).map_err(|_| format!("`{shown}`: a NUL in the path"))?;
        // SAFETY: a NUL-terminated name and plain flags. Loading runs the
        // library's constructors; a CUDA runtime's do not touch ours.
        let handle =
            unsafe { libc::dlopen(c_name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL | extra) };
        if handle.is_null() {
            return Err(dl_error(&shown));
        }
        let symbol = |sym: &CStr| -> Result<*mut c_void, String> {
            // SAFETY: `handle` is a live handle from dlopen (never closed)
            // and `sym` is NUL-terminated.
            let p = unsafe { libc::dlsym(handle, sym.as_ptr()) };
            if p.is_null() {
                let why = dl_error(&shown);
                return Err(format!(
                    "`{shown}` has no {} ({why})",
                    sym.to_string_lossy()
                ));
            }
            Ok(p)
        };
        let (register, unregister, error_string) = match (
            symbol(c"cudaHostRegister"),
            symbol(c"cudaHostUnregister"),
            symbol(c"cudaGetErrorString"),
        ) {
            (Ok(r), Ok(u), Ok(e)) => (r, u, e),
            (r, u, e) => {
                // SAFETY: the handle is ours and nothing from it is kept.
                unsafe { libc::dlclose(handle) };
                let first = [r, u, e].into_iter().find_map(|x| x.err());
                return Err(first.unwrap_or_default());
            }
        };
        // SAFETY: the symbols are the CUDA runtime API's functions of these
        // signatures (cuda_runtime_api.h); the library stays loaded.
        unsafe {
            Ok(Runtime {
                name: shown,
                register: std::mem::transmute::<*mut c_void, RegisterFn>(register),
                unregister: std::mem::transmute::<*mut c_void, UnregisterFn>(unregister),
                error_string: std::mem::transmute::<*mut c_void, ErrorStringFn>(error_string),
            })
        }
    }

    /// Where the runtime was found (its path or name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Pins `len` bytes at `ptr` for DMA (`cudaHostRegisterPortable`, and
    /// `cudaHostRegisterReadOnly` when the mapping is read-only) until the
    /// [`Registration`] drops. The range must stay mapped until then.
    pub fn register(
        &'static self,
        ptr: *mut u8,
        len: usize,
        read_only: bool,
    ) -> Result<Registration, String> {
        let mut flags = HOST_REGISTER_PORTABLE;
        if read_only {
            flags |= HOST_REGISTER_READ_ONLY;
        }
        // SAFETY: the caller keeps the range mapped while registered; the
        // runtime only records and pins it.
        let code = unsafe { (self.register)(ptr.cast(), len, flags) };
        if code != 0 {
            return Err(format!(
                "cudaHostRegister of {len} bytes failed: {} (error {code}, runtime {})",
                self.error_text(code),
                self.name
            ));
        }
        Ok(Registration {
            runtime: self,
            ptr,
            len,
        })
    }

    /// CUDA's text for an error code.
    fn error_text(&self, code: c_int) -> String {
        // SAFETY: cudaGetErrorString takes any code and returns a static
        // string (or NULL from a broken runtime, handled below).
        let text = unsafe { (self.error_string)(code) };
        if text.is_null() {
            return "unknown error".into();
        }
        // SAFETY: a NUL-terminated static string from the runtime.
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    }
}

/// The stats note of an arena that is not registered, and `why`.
pub fn not_registered(why: &str) -> String {
    format!("{why}: the arena is not registered with CUDA")
}

fn leak(rt: Runtime) -> &'static Runtime {
    Box::leak(Box::new(rt))
}

/// `what: ` and `dlerror()`'s message.
fn dl_error(what: &str) -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until
    // the next dl call on this thread; it is copied at once.
    let text = unsafe { libc::dlerror() };
    if text.is_null() {
        return format!("{what}: not found");
    }
    // SAFETY: as above.
    let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    if text.contains(what) {
        text.into_owned()
    } else {
        format!("{what}: {text}")
    }
}

/// A registered range; dropping it unregisters the range
/// (`cudaHostUnregister`), which must happen before the range is unmapped.
pub struct Registration {
    runtime: &'static Runtime,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the registration is an address and a length; CUDA may unregister
// a range from any thread of the process.
unsafe impl Send for Registration {}
// SAFETY: no method changes it; `&Registration` only reads the length.
unsafe impl Sync for Registration {}

impl Registration {
    /// Bytes registered.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // SAFETY: `ptr` was registered with this runtime and is still mapped
        // (the owner drops the registration before the mapping). A failure
        // leaves nothing to undo: the range is unmapped next regardless.
        unsafe { (self.runtime.unregister)(self.ptr.cast()) };
    }
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("runtime", &self.runtime.name)
            .finish()
    }
}

/// Tests replace the default runtime per thread, so a test's choice never
/// leaks into another's (the default lookup is loaded once per process).
#[cfg(test)]
pub(crate) mod test_override {
    use std::cell::RefCell;

    use super::Runtime;

    type Chosen = Result<&'static Runtime, String>;

    thread_local! {
        static CHOSEN: RefCell<Option<Chosen>> = const { RefCell::new(None) };
    }

    pub(super) fn get() -> Option<Chosen> {
        CHOSEN.with(|c| c.borrow().clone())
    }

    /// Runs `f` with [`super::runtime`] answering `chosen` on this thread.
    pub(crate) fn with<R>(chosen: Chosen, f: impl FnOnce() -> R) -> R {
        let before = CHOSEN.with(|c| c.replace(Some(chosen)));
        struct Restore(Option<Chosen>);
        impl Drop for Restore {
            fn drop(&mut self) {
                let before = self.0.take();
                CHOSEN.with(|c| *c.borrow_mut() = before);
            }
        }
        let _restore = Restore(before);
        f()
    }
}

/// A stand-in runtime for tests: a C library exporting the three entry
/// points, which records every call and fails registration on request.
#[cfg(test)]
pub(crate) mod fake {
    use std::ffi::{c_int, c_void};
    use std::path::Path;
    use std::process::Command;

    use super::Runtime;

    const SOURCE: &str = r#"
#include <stddef.h>
static int fail_code;
static int registers, unregisters;
static void *last_ptr, *last_unregistered;
static size_t last_len;
static unsigned last_flags;
int cudaHostRegister(void *ptr, size_t len, unsigned flags) {
    if (fail_code) return fail_code;
    registers++; last_ptr = ptr; last_len = len; last_flags = flags;
    return 0;
}
int cudaHostUnregister(void *ptr) { unregisters++; last_unregistered = ptr; return 0; }
const char *cudaGetErrorString(int code) {
    return code == 100 ? "no CUDA-capable device is detected" : "fake error";
}
void fake_fail(int code) { fail_code = code; }
void fake_calls(int *reg, int *unreg, void **ptr, size_t *len, unsigned *flags, void **unptr) {
    *reg = registers; *unreg = unregisters; *ptr = last_ptr; *len = last_len;
    *flags = last_flags; *unptr = last_unregistered;
}
"#;

    /// What the fake saw.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) struct Calls {
        pub registers: i32,
        pub unregisters: i32,
        pub ptr: usize,
        pub len: usize,
        pub flags: u32,
        pub unregistered: usize,
    }

    /// One fake runtime: its own file, so its own counters.
    pub(crate) struct Fake {
        pub runtime: &'static Runtime,
        fail: unsafe extern "C" fn(c_int),
        calls: unsafe extern "C" fn(
            *mut c_int,
            *mut c_int,
            *mut *mut c_void,
            *mut usize,
            *mut u32,
            *mut *mut c_void,
        ),
    }

    /// Builds the fake with `cc` (or `$CC`) into `dir` and loads it.
    pub(crate) fn build(dir: &Path) -> Fake {
        let src = dir.join("fake_cudart.c");
        let path = dir.join("libfake_cudart.so");
        std::fs::write(&src, SOURCE).unwrap();
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let out = Command::new(&cc)
            .args(["-shared", "-fPIC", "-Wall", "-Werror", "-o"])
            .arg(&path)
            .arg(&src)
            .output()
            .unwrap_or_else(|e| panic!("running `{cc}`: {e}"));
        assert!(
            out.status.success(),
            "{cc} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let runtime = Runtime::load(&path).expect("the fake runtime loads");
        let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: the library was just loaded; this takes another reference
        // to the same instance, never closed.
        let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        assert!(!handle.is_null());
        // SAFETY: symbols of the fake, of the signatures in SOURCE.
        unsafe {
            let fail = libc::dlsym(handle, c"fake_fail".as_ptr());
            let calls = libc::dlsym(handle, c"fake_calls".as_ptr());
            assert!(!fail.is_null() && !calls.is_null());
            Fake {
                runtime,
                fail: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int)>(fail),
                calls: std::mem::transmute::<
                    *mut c_void,
                    unsafe extern "C" fn(
                        *mut c_int,
                        *mut c_int,
                        *mut *mut c_void,
                        *mut usize,
                        *mut u32,
                        *mut *mut c_void,
                    ),
                >(calls),
            }
        }
    }

    impl Fake {
        /// Makes every later registration fail with `code` (0: succeed).
        pub(crate) fn fail_with(&self, code: i32) {
            // SAFETY: the fake's plain setter.
            unsafe { (self.fail)(code) }
        }

        pub(crate) fn calls(&self) -> Calls {
            let (mut r, mut u, mut flags) = (0, 0, 0);
            let (mut ptr, mut unptr, mut len) = (std::ptr::null_mut(), std::ptr::null_mut(), 0);
            // SAFETY: the fake writes each out-parameter once.
            unsafe { (self.calls)(&mut r, &mut u, &mut ptr, &mut len, &mut flags, &mut unptr) };
            Calls {
                registers: r,
                unregisters: u,
                ptr: ptr as usize,
                len,
                flags,
                unregistered: unptr as usize,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_runtime_is_an_error_with_dlopens_reason() {
        let e = Runtime::load(Path::new("/nonexistent/libcudart.so")).unwrap_err();
        assert!(e.contains("/nonexistent/libcudart.so"), "{e}");
        let e = Runtime::load(Path::new("a\0b")).unwrap_err();
        assert!(e.contains("NUL"), "{e}");
    }

    #[test]
    fn a_library_without_the_entry_points_is_an_error_naming_the_symbol() {
        // libc is loaded and has no cudaHostRegister.
        let e = Runtime::load(Path::new("libc.so.6")).unwrap_err();
        assert!(e.contains("cudaHostRegister"), "{e}");
    }

    #[test]
    fn the_default_lookup_answers_without_panicking() {
        // Without CUDA (this test's usual machine) the reason names a
        // runtime file; with one, registering a page works.
        match runtime() {
            Err(e) => assert!(e.contains("libcudart"), "{e}"),
            Ok(rt) => assert!(!rt.name().is_empty()),
        }
        let chosen = Err("no runtime here".to_string());
        let e = test_override::with(chosen, || register(std::ptr::null_mut(), 4096, false));
        assert_eq!(e.unwrap_err(), "no runtime here");
    }

    #[test]
    fn the_fake_runtime_sees_the_range_and_the_flags_and_the_unregistration() {
        let dir = tempfile::tempdir().unwrap();
        let fake = fake::build(dir.path());
        let mut page = vec![0u8; 8192];
        let ptr = page.as_mut_ptr();
        let reg = fake.runtime.register(ptr, page.len(), false).unwrap();
        assert_eq!(reg.len(), 8192);
        let c = fake.calls();
        assert_eq!((c.registers, c.unregisters), (1, 0));
        assert_eq!(
            (c.ptr, c.len, c.flags),
            (ptr as usize, 8192, HOST_REGISTER_PORTABLE)
        );
        drop(reg);
        let c = fake.calls();
        assert_eq!((c.unregisters, c.unregistered), (1, ptr as usize));

        let ro = fake.runtime.register(ptr, 4096, true).unwrap();
        assert_eq!(
            fake.calls().flags,
            HOST_REGISTER_PORTABLE | HOST_REGISTER_READ_ONLY
        );
        drop(ro);

        fake.fail_with(100);
        let e = fake.runtime.register(ptr, 4096, false).unwrap_err();
        assert!(e.contains("no CUDA-capable device is detected"), "{e}");
        assert!(e.contains("error 100"), "{e}");
        assert_eq!(fake.calls().registers, 2);
    }
}
