//! Model-checks the lock-free ring with loom: `src/queue/ring.rs` is compiled here
//! against loom's atomics and cells (the `sync` module below has the shape of
//! `src/queue/sync.rs`), and loom runs every interleaving of the threads, within a
//! preemption bound, checking that each value arrives exactly once, in order
//! per producer, that nothing is lost when the ring is full, and that
//! undelivered values are dropped with the ring.

#[allow(dead_code)]
mod sync {
    pub(crate) use loom::cell::UnsafeCell;
    pub(crate) use loom::sync::atomic::{AtomicUsize, Ordering, fence};

    pub(crate) fn spin() {
        loom::thread::yield_now();
    }
}

#[allow(dead_code)]
#[path = "../src/queue/ring.rs"]
mod ring;

use loom::sync::Arc;
use ring::Ring;

fn model(f: impl Fn() + Sync + Send + 'static) {
    model_bounded(3, f)
}

fn model_bounded(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    // Bugs in rings of this kind show up within two or three preemptions;
    // the bound keeps the run to seconds.
    b.preemption_bound = Some(preemptions);
    // A thread that finds another's operation half done yields until it is
    // finished; those waits are long branch chains in the model.
    b.max_branches = 10_000;
    b.check(f);
}

/// Pushes, retrying a bounded number of times while the ring is full; true
/// when the value went in (loom needs every loop bounded).
fn push_some<T>(r: &Ring<T>, mut v: T) -> bool {
    for _ in 0..3 {
        match r.push(v) {
            Ok(()) => return true,
            Err(back) => {
                v = back;
                loom::thread::yield_now();
            }
        }
    }
    false
}

#[test]
fn two_producers_one_consumer_exactly_once_and_in_order() {
    model(|| {
        let r = Arc::new(Ring::new(2));
        let producers: Vec<_> = [10u32, 20]
            .into_iter()
            .map(|base| {
                let r = Arc::clone(&r);
                loom::thread::spawn(move || {
                    let mut sent = Vec::new();
                    for v in [base, base + 1] {
                        if push_some(&r, v) {
                            sent.push(v);
                        }
                    }
                    sent
                })
            })
            .collect();
        let mut got = Vec::new();
        for _ in 0..2 {
            if let Some(v) = r.pop() {
                got.push(v);
            }
        }
        let sent: Vec<Vec<u32>> = producers.into_iter().map(|p| p.join().unwrap()).collect();
        while let Some(v) = r.pop() {
            got.push(v);
        }
        // Exactly what was accepted arrives, once, and per producer in order.
        for (s, base) in sent.iter().zip([10u32, 20]) {
            let mine: Vec<u32> = got
                .iter()
                .filter(|&&v| v / 10 == base / 10)
                .copied()
                .collect();
            assert_eq!(&mine, s);
        }
        assert_eq!(got.len(), sent.iter().map(Vec::len).sum::<usize>());
    });
}

#[test]
fn a_full_ring_hands_the_value_back() {
    model(|| {
        let r = Arc::new(Ring::new(2));
        let t = {
            let r = Arc::clone(&r);
            loom::thread::spawn(move || r.pop())
        };
        assert!(r.push(1).is_ok());
        assert!(r.push(2).is_ok());
        let third = r.push(3);
        let popped = t.join().unwrap();
        let mut rest = Vec::new();
        while let Some(v) = r.pop() {
            rest.push(v);
        }
        match (popped, third) {
            (Some(1), Ok(())) => assert_eq!(rest, vec![2, 3]),
            (Some(1), Err(3)) => assert_eq!(rest, vec![2]),
            (None, Err(3)) => assert_eq!(rest, vec![1, 2]),
            other => panic!("impossible outcome {other:?}"),
        }
    });
}

#[test]
fn two_consumers_race_for_values_without_duplicates() {
    // Three threads, two of them able to wait in yield loops on a half-done
    // pop: at two preemptions the model does not finish in minutes, so this
    // one runs at one (every single preemption point, every interleaving of
    // the rest). The multi-consumer stress test in `channel.rs` adds breadth.
    model_bounded(1, || {
        let r = Arc::new(Ring::new(1));
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                let r = Arc::clone(&r);
                loom::thread::spawn(move || r.pop())
            })
            .collect();
        let first = r.push(1u32).is_ok();
        let second = r.push(2u32).is_ok();
        assert!(first, "an empty ring of capacity 1 takes a value");
        let mut all: Vec<u32> = consumers
            .into_iter()
            .filter_map(|c| c.join().unwrap())
            .collect();
        while let Some(v) = r.pop() {
            all.push(v);
        }
        all.sort();
        // Every accepted value arrives once; a refused one was handed back.
        let want: Vec<u32> = if second { vec![1, 2] } else { vec![1] };
        assert_eq!(all, want);
    });
}

#[test]
fn values_left_behind_are_dropped_with_the_ring() {
    model(|| {
        let token = Arc::new(());
        let r = Arc::new(Ring::new(2));
        let t = {
            let r = Arc::clone(&r);
            let token = Arc::clone(&token);
            loom::thread::spawn(move || {
                let _ = r.push(Arc::clone(&token));
                let _ = r.push(token);
            })
        };
        let _ = r.pop();
        t.join().unwrap();
        drop(r);
        assert_eq!(Arc::strong_count(&token), 1);
    });
}
