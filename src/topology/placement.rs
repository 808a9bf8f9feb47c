//! The choice of one CPU per I/O thread: a pure function of the topology,
//! the allowed CPUs, the CPUs other engines claimed and the configuration's
//! overrides. No I/O, deterministic, property-tested below.
//!
//! The plan's streams fix the sample order; this only decides where the
//! threads that serve them run, so nothing here can change the order.

use serde::Serialize;

use super::Topology;

/// What to place.
#[derive(Debug, Clone, Copy, Default)]
pub struct PlacementRequest<'a> {
    /// I/O threads, one CPU each.
    pub threads: usize,
    /// The CPUs this process may use.
    pub allowed: &'a [usize],
    /// CPUs other engines hold: used only once every other usable CPU is taken.
    pub claimed: &'a [usize],
    /// The interface that routes to the data, when known.
    pub nic: Option<&'a str>,
    /// The configuration's explicit CPUs (`cpus`), already checked to lie
    /// in `allowed`.
    pub cpus: Option<&'a [usize]>,
    /// The configuration's NUMA node (`numa_node`), instead of the NIC's.
    pub numa_node: Option<usize>,
}

/// Why the CPUs are these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Why {
    /// The configuration's `cpus`.
    Config,
    /// Every thread on a CPU that takes one of the NIC's queue interrupts.
    NicQueues,
    /// Some on other CPUs of the NIC's (or the configured) NUMA node.
    Numa,
    /// Some on other allowed CPUs.
    Allowed,
    /// Not pinned: more threads than usable CPUs.
    TooMany { threads: usize, cpus: usize },
    /// Not pinned: the configuration said so (`pin_cpus` false).
    Off,
}

impl Why {
    /// How the stats and `ringfeed topology` say it.
    pub fn describe(&self) -> String {
        match self {
            Why::Config => "config".into(),
            Why::NicQueues => "nic-queues".into(),
            Why::Numa => "numa".into(),
            Why::Allowed => "allowed".into(),
            Why::TooMany { threads, cpus } => format!("none ({threads} threads > {cpus} CPUs)"),
            Why::Off => "none (pin_cpus is false)".into(),
        }
    }
}

/// The decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// One CPU per thread, all different; `None`: do not pin.
    pub cpus: Option<Vec<usize>>,
    pub why: Why,
    /// The NIC the data arrives on, when one was found.
    pub nic: Option<String>,
    /// The NUMA node the threads (and the arena) belong on: the configured
    /// one, else the NIC's, else the only node, else the first chosen CPU's.
    pub numa_node: Option<usize>,
}

/// Preference tiers, best first.
const QUEUE: u8 = 0;
const NODE: u8 = 1;
const REST: u8 = 2;

/// The CPU for each of `req.threads` I/O threads.
///
/// Order of preference: the CPUs that take the interrupts of the data
/// NIC's receive queues (round-robin over the queues, so each queue gets
/// one before any gets two), then the other CPUs of its NUMA node, then the
/// rest of the allowed set, each in ascending order; among those, CPUs no
/// other engine claimed come first. Never a CPU outside `allowed` (or
/// outside `cpus` when the configuration lists them), never one CPU twice.
///
/// `None` (no pinning) when there are more threads than usable CPUs. Two
/// threads pinned to one CPU cannot move to another that is idle: with 4
/// workers on the 2-CPU dev machine, pinned receives over loopback HTTP
/// took 1.2x the wall time of the same unpinned (each waits for its CPU
/// while the other CPU idles).
pub fn worker_cpus(topo: &Topology, req: &PlacementRequest) -> Placement {
    let nic = topo.data_nic(req.nic);
    let mut node = req
        .numa_node
        .or(nic.and_then(|n| n.numa_node))
        .or_else(|| (topo.nodes.len() == 1).then(|| topo.nodes[0].id));
    let node_cpus: &[usize] = node
        .and_then(|id| topo.nodes.iter().find(|n| n.id == id))
        .map_or(&[], |n| &n.cpus);
    let usable: Vec<usize> = match req.cpus {
        Some(list) => list
            .iter()
            .copied()
            .filter(|c| req.allowed.contains(c))
            .collect(),
        None => req.allowed.to_vec(),
    };
    // Queue CPUs round-robin: the first CPU of each queue, then the second...
    let mut queue_cpus = Vec::new();
    if let Some(nic) = nic {
        let longest = nic.queues.iter().map(|q| q.cpus.len()).max().unwrap_or(0);
        for k in 0..longest {
            for q in &nic.queues {
                if let Some(&c) = q.cpus.get(k)
                    && !queue_cpus.contains(&c)
                    // A configured node keeps the threads on it.
                    && (req.numa_node.is_none() || node_cpus.is_empty() || node_cpus.contains(&c))
                {
                    queue_cpus.push(c);
                }
            }
        }
    }
    let tier = |c: usize| {
        if queue_cpus.contains(&c) {
            QUEUE
        } else if node_cpus.contains(&c) {
            NODE
        } else {
            REST
        }
    };
    let mut ranked: Vec<(bool, u8, usize, usize)> = usable
        .iter()
        .map(|&c| {
            // Within the queue tier, the round-robin order; else ascending.
            let pos = queue_cpus.iter().position(|&q| q == c).unwrap_or(c);
            (req.claimed.contains(&c), tier(c), pos, c)
        })
        .collect();
    ranked.sort_unstable();
    ranked.dedup_by_key(|r| r.3);
    let nic_name = nic.map(|n| n.name.clone());
    if req.threads > ranked.len() || ranked.is_empty() {
        return Placement {
            cpus: None,
            why: Why::TooMany {
                threads: req.threads,
                cpus: ranked.len(),
            },
            nic: nic_name,
            numa_node: node,
        };
    }
    let chosen = &ranked[..req.threads];
    let worst = chosen.iter().map(|r| r.1).max().unwrap_or(QUEUE);
    let cpus: Vec<usize> = chosen.iter().map(|r| r.3).collect();
    if node.is_none() {
        node = cpus.first().and_then(|&c| topo.node_of_cpu(c));
    }
    Placement {
        cpus: Some(cpus),
        why: match worst {
            _ if req.cpus.is_some() => Why::Config,
            QUEUE => Why::NicQueues,
            NODE => Why::Numa,
            _ => Why::Allowed,
        },
        nic: nic_name,
        numa_node: node,
    }
}

/// The CPUs the image pipeline's threads (`transform_threads`) may run
/// on, placed like the I/O threads but as a set, not one CPU each (the
/// scheduler spreads them; they are busy while the I/O threads wait): the
/// configuration's `cpus` when it lists them, else the allowed CPUs of the
/// NUMA node the I/O threads were placed on (the arena's and the NIC's),
/// else every allowed CPU. `None`: no narrower set than the process's own
/// (the threads are not pinned).
pub fn transform_cpus(
    topo: &Topology,
    allowed: &[usize],
    cpus: Option<&[usize]>,
    numa_node: Option<usize>,
) -> Option<Vec<usize>> {
    let within = |list: &[usize]| -> Vec<usize> {
        list.iter()
            .copied()
            .filter(|c| allowed.contains(c))
            .collect()
    };
    let set = match (cpus, numa_node) {
        (Some(list), _) => within(list),
        (None, Some(id)) => topo
            .nodes
            .iter()
            .find(|n| n.id == id)
            .map(|n| within(&n.cpus))
            .unwrap_or_default(),
        (None, None) => Vec::new(),
    };
    (!set.is_empty() && set.len() < allowed.len()).then_some(set)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::topology::{Nic, NumaNode, Queue};

    /// `cpus` CPUs over `nodes` nodes (contiguous halves), one NIC on
    /// `nic_node` whose queue `i` takes its interrupts on `queue_cpus[i]`.
    fn machine(
        cpus: usize,
        nodes: usize,
        nic_node: Option<usize>,
        queue_cpus: &[Vec<usize>],
    ) -> Topology {
        let per = cpus.div_ceil(nodes.max(1)).max(1);
        Topology {
            nics: vec![Nic {
                name: "eth0".into(),
                numa_node: nic_node,
                rx_queues: queue_cpus.len(),
                queues: queue_cpus
                    .iter()
                    .enumerate()
                    .map(|(index, c)| Queue {
                        index,
                        cpus: c.clone(),
                        ..Queue::default()
                    })
                    .collect(),
                ..Nic::default()
            }],
            nodes: (0..nodes)
                .map(|id| NumaNode {
                    id,
                    cpus: (id * per..((id + 1) * per).min(cpus)).collect(),
                })
                .collect(),
            affinity: (0..cpus).collect(),
            ..Topology::default()
        }
    }

    fn place(topo: &Topology, threads: usize, claimed: &[usize]) -> Placement {
        let allowed = topo.allowed();
        worker_cpus(
            topo,
            &PlacementRequest {
                threads,
                allowed: &allowed,
                claimed,
                ..PlacementRequest::default()
            },
        )
    }

    #[test]
    fn queue_cpus_then_the_node_then_the_rest() {
        // 8 CPUs, two nodes; the NIC on node 1 with queues on CPUs 6 and 5.
        let topo = machine(8, 2, Some(1), &[vec![6], vec![5]]);
        let p = place(&topo, 2, &[]);
        assert_eq!(p.cpus, Some(vec![6, 5]));
        assert_eq!(p.why, Why::NicQueues);
        assert_eq!(p.numa_node, Some(1));
        let p = place(&topo, 4, &[]);
        assert_eq!(p.cpus, Some(vec![6, 5, 4, 7]));
        assert_eq!(p.why, Why::Numa);
        let p = place(&topo, 5, &[]);
        assert_eq!(p.cpus, Some(vec![6, 5, 4, 7, 0]));
        assert_eq!(p.why, Why::Allowed);
        // Claimed CPUs go last.
        let p = place(&topo, 2, &[6, 4]);
        assert_eq!(p.cpus, Some(vec![5, 7]));
        // More threads than CPUs: none pinned.
        let p = place(&topo, 9, &[]);
        assert_eq!(p.cpus, None);
        assert_eq!(p.why.describe(), "none (9 threads > 8 CPUs)");
    }

    #[test]
    fn a_configured_list_or_node_wins() {
        let topo = machine(8, 2, Some(1), &[vec![6], vec![5]]);
        let allowed = topo.allowed();
        let p = worker_cpus(
            &topo,
            &PlacementRequest {
                threads: 2,
                allowed: &allowed,
                claimed: &[1],
                cpus: Some(&[1, 2, 3]),
                ..PlacementRequest::default()
            },
        );
        assert_eq!(p.cpus, Some(vec![2, 3]));
        assert_eq!(p.why, Why::Config);
        assert_eq!(p.why.describe(), "config");
        let p = worker_cpus(
            &topo,
            &PlacementRequest {
                threads: 2,
                allowed: &allowed,
                numa_node: Some(0),
                ..PlacementRequest::default()
            },
        );
        assert_eq!(p.cpus, Some(vec![0, 1]));
        assert_eq!(p.numa_node, Some(0));
    }

    /// A topology, the allowed CPUs, the claimed ones, the thread count,
    /// and the configured list and node.
    type Scenario = (
        Topology,
        Vec<usize>,
        Vec<usize>,
        usize,
        Option<Vec<usize>>,
        Option<usize>,
    );

    /// A random machine: up to 64 CPUs over 1-4 nodes, a NIC with up to 16
    /// queues whose interrupts land on random CPUs, a random allowed set
    /// and claims, sometimes a configured list or node.
    fn scenario() -> impl Strategy<Value = Scenario> {
        (1usize..64, 1usize..4).prop_flat_map(|(cpus, nodes)| {
            (
                prop::collection::vec(prop::collection::vec(0..cpus, 0..3), 0..16),
                prop::option::of(0..nodes),
                prop::collection::vec(any::<bool>(), cpus),
                prop::collection::vec(any::<bool>(), cpus),
                0usize..70,
                prop::option::of(prop::collection::vec(0..cpus, 0..8)),
                prop::option::of(0..nodes),
            )
                .prop_map(
                    move |(queues, nic_node, allowed, claimed, threads, list, node)| {
                        let topo = machine(cpus, nodes, nic_node, &queues);
                        let pick = |m: &[bool]| (0..cpus).filter(|&c| m[c]).collect::<Vec<usize>>();
                        let mut allowed = pick(&allowed);
                        if allowed.is_empty() {
                            allowed.push(0);
                        }
                        (topo, allowed, pick(&claimed), threads, list, node)
                    },
                )
        })
    }

    proptest! {
        #[test]
        fn placement_keeps_its_rules(
            (topo, allowed, claimed, threads, list, node) in scenario()
        ) {
            let req = PlacementRequest {
                threads,
                allowed: &allowed,
                claimed: &claimed,
                nic: None,
                cpus: list.as_deref(),
                numa_node: node,
            };
            let p = worker_cpus(&topo, &req);
            // Deterministic.
            prop_assert_eq!(&p, &worker_cpus(&topo, &req));
            let mut usable: Vec<usize> = match &list {
                Some(l) => l.iter().copied().filter(|c| allowed.contains(c)).collect(),
                None => allowed.clone(),
            };
            usable.sort_unstable();
            usable.dedup();
            let Some(cpus) = &p.cpus else {
                // Not pinned only when threads outnumber the usable CPUs.
                prop_assert!(threads > usable.len() || usable.is_empty());
                return Ok(());
            };
            prop_assert_eq!(cpus.len(), threads);
            let mut distinct = cpus.clone();
            distinct.sort_unstable();
            distinct.dedup();
            prop_assert_eq!(distinct.len(), cpus.len(), "a CPU twice: {:?}", cpus);
            prop_assert!(cpus.iter().all(|c| usable.contains(c)), "{:?} outside {:?}", cpus, usable);
            // Claimed CPUs only once the unclaimed ones are used up.
            let free = usable.iter().filter(|c| !claimed.contains(c)).count();
            let on_claimed = cpus.iter().filter(|c| claimed.contains(c)).count();
            prop_assert_eq!(on_claimed, threads.saturating_sub(free));
            // Preference: an unclaimed queue CPU is passed over only when
            // every chosen CPU is one too (or a configured node excludes it).
            if node.is_none() {
                let queue: Vec<usize> = topo.nics[0].queues.iter().flat_map(|q| q.cpus.clone()).collect();
                let skipped_queue = usable.iter().any(|c| {
                    queue.contains(c) && !claimed.contains(c) && !cpus.contains(c)
                });
                let off_queue = cpus.iter().any(|c| !queue.contains(c) && !claimed.contains(c));
                prop_assert!(!(skipped_queue && off_queue), "{:?} skips a queue CPU", cpus);
            }
        }
    }

    #[test]
    fn transform_threads_go_on_the_io_threads_node() {
        // Two nodes of 4; the I/O threads' node is 1.
        let topo = machine(8, 2, Some(1), &[vec![6], vec![5]]);
        let allowed = topo.allowed();
        assert_eq!(
            transform_cpus(&topo, &allowed, None, Some(1)),
            Some(vec![4, 5, 6, 7])
        );
        // Within what the process may use.
        assert_eq!(
            transform_cpus(&topo, &[0, 1, 5, 6], None, Some(1)),
            Some(vec![5, 6])
        );
        // The configuration's CPUs win.
        assert_eq!(
            transform_cpus(&topo, &allowed, Some(&[2, 3]), Some(1)),
            Some(vec![2, 3])
        );
        // One node, or no node known: the process's own CPUs, not pinned.
        let one = machine(4, 1, None, &[vec![0]]);
        assert_eq!(transform_cpus(&one, &one.allowed(), None, Some(0)), None);
        assert_eq!(transform_cpus(&topo, &allowed, None, None), None);
        // A node the process may not use: not pinned rather than nowhere.
        assert_eq!(transform_cpus(&topo, &[0, 1], None, Some(1)), None);
    }
}
