//! Where workers run: the CPUs this process may use, and which one each
//! worker is pinned to.
//!
//! Today a worker takes the allowed CPUs in order. The seam for the NIC-queue
//! mapping (one worker per queue, on the CPU that takes its interrupts) is
//! [`worker_cpus`]: it will take the queue layout read from `/sys` as well.

/// CPUs in the process's affinity mask, ascending.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable cpu_set_t of the size we pass.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        return (0..n).collect();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `i` is below CPU_SETSIZE, the set's capacity.
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .collect()
}

/// The CPU for each of `workers` workers, from `allowed`, starting at the
/// `first`-th allowed CPU and wrapping around; `None` (no pinning) when
/// there are more workers than allowed CPUs. Two workers pinned to one CPU
/// cannot move to another that is idle: with 4 workers on this 2-CPU dev
/// machine, pinned receives over loopback HTTP took 1.2x the wall time of
/// the same unpinned (each waits for its CPU while the other CPU idles).
pub fn worker_cpus(workers: usize, first: usize, allowed: &[usize]) -> Option<Vec<usize>> {
    if allowed.is_empty() || workers > allowed.len() {
        return None;
    }
    Some(
        (0..workers)
            .map(|i| allowed[first.wrapping_add(i) % allowed.len()])
            .collect(),
    )
}

/// Pins the calling thread to `cpu`.
pub fn pin_current_thread(cpu: usize) -> std::io::Result<()> {
    // SAFETY: as in `allowed_cpus`.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is checked against CPU_SETSIZE by the caller's source
    // (`allowed_cpus`); CPU_SET on a valid set is sound.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: a valid cpu_set_t and its size.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_cycle_over_the_allowed_cpus() {
        assert_eq!(worker_cpus(2, 0, &[2, 5]), Some(vec![2, 5]));
        assert_eq!(worker_cpus(2, 0, &[]), None);
        // More workers than CPUs: none is pinned, so none waits on a busy
        // CPU while another idles.
        assert_eq!(worker_cpus(3, 0, &[2, 5]), None);
        // A second loader worker's engine starts where the first one's ends.
        assert_eq!(worker_cpus(2, 2, &[0, 1, 2, 3]), Some(vec![2, 3]));
        assert_eq!(worker_cpus(2, 3, &[0, 1, 2]), Some(vec![0, 1]));
        assert!(!allowed_cpus().is_empty());
    }
}
