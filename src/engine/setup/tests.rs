use super::*;

/// A node engine's budget of `chunks` chunks of 8 MiB in pages of `page`
/// bytes, as fixed buffers no ring is ever given (the decisions below come
/// before any registering).
fn budget(chunks: usize, page: usize) -> Arc<FixedBuffers> {
    let iovecs = (0..chunks)
        .map(|_| libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 8 << 20,
        })
        .collect();
    // SAFETY: never registered: only counted.
    let fixed = unsafe { FixedBuffers::new(iovecs) };
    Arc::new(fixed.owned_by(Arc::new(()), page))
}

#[test]
fn the_kernel_s_tables_of_pinned_pages_are_16_bytes_a_page_a_ring() {
    // 448 MiB of 4 KiB pages in 2 rings: 3.5 MiB.
    assert_eq!(pin_tables(448 << 20, 4096, 2), 7 << 19);
    // 16 GiB in 64 rings: 4 GiB of 4 KiB pages, 8 MiB of huge pages.
    assert_eq!(pin_tables(16 << 30, 4096, 64), 4 << 30);
    assert_eq!(pin_tables(16 << 30, 2 << 20, 64), 8 << 20);
}

#[test]
fn a_node_engine_registers_its_budget_on_auto_only_for_files_and_within_the_tables_bound() {
    let net = NetOptions::for_config(&Config::default());
    let small = budget(56, 4096);
    // Off, or auto with nothing but remote shards and no cache: nothing
    // to register, and nothing to say.
    assert!(
        engine_fixed(&small, Toggle::Off, 2, true, &net)
            .unwrap()
            .is_none()
    );
    assert!(
        engine_fixed(&small, Toggle::Auto, 2, false, &net)
            .unwrap()
            .is_none()
    );
    // 16 GiB of 4 KiB pages in 64 rings: refused on auto, saying why.
    let large = budget(2048, 4096);
    let e = engine_fixed(&large, Toggle::Auto, 64, true, &net).unwrap_err();
    assert!(e.contains("4096 MiB of the kernel's tables"), "{e}");
    // Control: the same budget in 1 ring is at the bound (64 MiB), within
    // it (whatever RLIMIT_MEMLOCK then says), and so is it in huge pages
    // in 64.
    for (fixed, rings) in [(&large, 1), (&budget(2048, 2 << 20), 64)] {
        match engine_fixed(fixed, Toggle::Auto, rings, true, &net) {
            Ok(f) => assert!(f.is_some()),
            Err(e) => assert!(!e.contains("tables"), "{e}"),
        }
    }
}

#[test]
fn a_node_engine_on_the_thread_backend_refuses_register_buffers_on_and_says_why() {
    let cfg = |j: &str| Config::from_json(j).unwrap();
    let fixed = budget(4, 4096);
    let on = cfg(r#"{"urls":"a","io_backend":"threads","register_buffers":"on"}"#);
    let e = engine_net_threads(&on, &[], &fixed)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("`register_buffers` is \"on\" but the node engine runs the thread backend"),
        "{e}"
    );
    // Control: auto runs without I/O threads, and without fixed buffers.
    let auto = cfg(r#"{"urls":"a","io_backend":"threads"}"#);
    let net = engine_net_threads(&auto, &[], &fixed).unwrap().unwrap();
    assert!(net.links.is_empty() && net.fixed.is_none());
}
