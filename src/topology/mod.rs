//! Where the I/O threads run and where the arena lives: the machine's NICs,
//! their receive queues and the CPUs that take those queues' interrupts,
//! the NUMA nodes, the CPUs this process may use, and the choice of one CPU
//! per I/O thread (docs/memory.md, "Topology and placement"; docs/design.md,
//! "Where the work runs").
//!
//! - `discover.rs` reads `/sys` and `/proc` under roots it is given (tests
//!   build fake trees) into a [`Topology`]; a file it cannot read is never
//!   an error, only a line in [`Topology::unread`];
//! - `placement.rs` is the pure rule ([`worker_cpus`]): queue CPUs first,
//!   then the NIC's NUMA node, then the rest of the allowed set, away from
//!   CPUs other engines claimed;
//! - `claims.rs` holds those claims: one `flock`ed file per CPU in a
//!   per-user directory, so engines in separate processes (and separate
//!   loaders of one process) do not pin onto the same CPUs.
//!
//! Nothing here knows the engine or the configuration: callers pass plain
//! values in.

pub(crate) mod claims;
mod discover;
mod placement;

use serde::Serialize;

pub use claims::{Claims, ClaimsDir};
pub use discover::{Roots, discover, discover_at};
pub use placement::{Placement, PlacementRequest, Why, transform_cpus, worker_cpus};

/// What was read of the machine.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Topology {
    /// Network devices backed by hardware (virtual ones without a
    /// `device/` link, and `lo`, are left out), by name.
    pub nics: Vec<Nic>,
    /// NUMA nodes and their CPUs; empty when `/sys` has none.
    pub nodes: Vec<NumaNode>,
    /// The process's affinity mask (`sched_getaffinity`).
    pub affinity: Vec<usize>,
    /// The cgroup's `cpuset.cpus.effective`, when the file is there.
    pub cpuset: Option<Vec<usize>>,
    /// The interface of the IPv4 default route, when `/proc/net/route` has one.
    pub default_route: Option<String>,
    /// What could not be read, and why (missing files, unparsable text).
    pub unread: Vec<String>,
}

/// One NIC.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Nic {
    pub name: String,
    /// The driver's name (`device/driver` link), when known.
    pub driver: Option<String>,
    /// `device/numa_node`; `None` when the file is missing or says -1.
    pub numa_node: Option<usize>,
    pub rx_queues: usize,
    pub tx_queues: usize,
    /// One entry per receive queue, in queue order.
    pub queues: Vec<Queue>,
    /// How the queues' interrupts were found: "names" (matched by name in
    /// `/proc/interrupts`), "msi-order" (the device's MSI interrupts taken
    /// in order: no name matched) or "none".
    pub irq_match: &'static str,
}

/// One receive queue and the interrupt that signals it.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Queue {
    pub index: usize,
    pub irq: Option<u32>,
    /// The interrupt's name in `/proc/interrupts`.
    pub irq_name: Option<String>,
    /// The CPUs that take it: `effective_affinity_list` where the kernel
    /// has it (what the interrupt controller really targets), else
    /// `smp_affinity_list`.
    pub cpus: Vec<usize>,
}

/// One NUMA node.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct NumaNode {
    pub id: usize,
    pub cpus: Vec<usize>,
}

impl Topology {
    /// The CPUs this process may use: the affinity mask, within the cgroup's
    /// cpuset when one was read (the kernel already applies the cpuset to
    /// the mask; a mask read before a cpuset change may be wider).
    pub fn allowed(&self) -> Vec<usize> {
        match &self.cpuset {
            Some(set) if self.affinity.iter().any(|c| set.contains(c)) => self
                .affinity
                .iter()
                .copied()
                .filter(|c| set.contains(c))
                .collect(),
            _ => self.affinity.clone(),
        }
    }

    /// The NIC the data arrives on: `routed` (the interface that routes to
    /// the data's host) when it is one of the NICs, else the default route's,
    /// else the NIC with the most receive queues (the first by name among
    /// equals).
    pub fn data_nic(&self, routed: Option<&str>) -> Option<&Nic> {
        let by_name = |n: &str| self.nics.iter().find(|x| x.name == n);
        routed
            .and_then(by_name)
            .or_else(|| self.default_route.as_deref().and_then(by_name))
            .or_else(|| {
                self.nics
                    .iter()
                    .rev()
                    .max_by_key(|n| n.queues.len().max(n.rx_queues))
            })
    }

    /// The NUMA node of `cpu`, when the nodes were read.
    pub fn node_of_cpu(&self, cpu: usize) -> Option<usize> {
        self.nodes
            .iter()
            .find(|n| n.cpus.contains(&cpu))
            .map(|n| n.id)
    }
}

/// Parses a kernel CPU list (`0-3,8,10-11`; also `cpulist` and
/// `smp_affinity_list` files). Empty text is the empty list. Sorted,
/// without duplicates.
pub fn parse_cpu_list(text: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in text.trim().split(',').map(str::trim) {
        if part.is_empty() {
            continue;
        }
        let num = |s: &str| {
            s.trim()
                .parse::<usize>()
                .map_err(|_| format!("`{part}` is not a CPU number or range"))
        };
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => (num(part)?, num(part)?),
        };
        if a > b {
            return Err(format!("`{part}`: the range runs backwards"));
        }
        // CPU_SETSIZE: no CPU at or above it can be pinned to anyway.
        if b >= libc::CPU_SETSIZE as usize {
            return Err(format!("`{part}`: CPU {b} is past {}", libc::CPU_SETSIZE));
        }
        out.extend(a..=b);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Writes CPUs as a kernel CPU list (`0-3,8`).
pub fn format_cpu_list(cpus: &[usize]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        parts.push(match j - i {
            0 => sorted[i].to_string(),
            _ => format!("{}-{}", sorted[i], sorted[j]),
        });
        i = j + 1;
    }
    parts.join(",")
}

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

/// Pins the calling thread to `cpu`.
pub fn pin_current_thread(cpu: usize) -> std::io::Result<()> {
    pin_current_thread_to(&[cpu])
}

/// Lets the calling thread run on `cpus` only.
pub fn pin_current_thread_to(cpus: &[usize]) -> std::io::Result<()> {
    if cpus.is_empty() || cpus.iter().any(|&c| c >= libc::CPU_SETSIZE as usize) {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: as in `allowed_cpus`.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        // SAFETY: `cpu` is below CPU_SETSIZE (checked above); CPU_SET on
        // a valid set is sound.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
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
    fn cpu_lists_parse_and_print_as_the_kernel_writes_them() {
        assert_eq!(parse_cpu_list("0-3,8\n").unwrap(), vec![0, 1, 2, 3, 8]);
        assert_eq!(parse_cpu_list("").unwrap(), Vec::<usize>::new());
        assert_eq!(parse_cpu_list("5,1,1").unwrap(), vec![1, 5]);
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("x").is_err());
        assert!(parse_cpu_list("0-99999").is_err());
        assert_eq!(format_cpu_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
    }

    /// Found by fuzzing (`config`): `"cpus": "53463122,1"` was accepted
    /// (a single CPU was not checked against CPU_SETSIZE, a range was, and
    /// `"cpus": [53463122]` was refused).
    #[test]
    fn a_single_cpu_past_cpu_setsize_is_refused_as_a_range_is() {
        let past = libc::CPU_SETSIZE as usize;
        assert!(parse_cpu_list(&format!("{past}")).is_err());
        assert!(parse_cpu_list("53463122,1").is_err());
        assert_eq!(
            parse_cpu_list(&format!("{}", past - 1)).unwrap(),
            vec![past - 1]
        );
        assert_eq!(format_cpu_list(&[]), "");
        assert!(!allowed_cpus().is_empty());
    }

    #[test]
    fn the_allowed_set_is_the_mask_within_the_cpuset() {
        let mut t = Topology {
            affinity: vec![0, 1, 2, 3],
            ..Topology::default()
        };
        assert_eq!(t.allowed(), vec![0, 1, 2, 3]);
        t.cpuset = Some(vec![2, 3, 4]);
        assert_eq!(t.allowed(), vec![2, 3]);
        // A cpuset that shares nothing with the mask is stale: the mask wins.
        t.cpuset = Some(vec![9]);
        assert_eq!(t.allowed(), vec![0, 1, 2, 3]);
    }
}
