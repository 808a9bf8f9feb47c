//! Discovery over fake `/sys` and `/proc` trees of the machine shapes the
//! engine meets: a one-queue virtio VM, a 64-queue NIC over two NUMA
//! nodes, interrupts all on CPU 0 (irqbalance off), a restricted cpuset,
//! and an empty tree. Each is placed too.

use std::os::unix::fs::symlink;
use std::path::PathBuf;

use super::*;
use crate::topology::{PlacementRequest, Why, worker_cpus};

struct Fake {
    dir: tempfile::TempDir,
    interrupts: Vec<String>,
    /// Write `effective_affinity_list` (a kernel that has it), or only
    /// `smp_affinity_list`.
    effective: bool,
}

/// One interrupt of a fake device: number, name, CPUs.
struct Irq<'a>(u32, &'a str, &'a str);

impl Fake {
    fn new() -> Fake {
        Fake {
            dir: tempfile::tempdir().unwrap(),
            interrupts: vec!["           CPU0       CPU1".into()],
            effective: true,
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn write(&self, rel: &str, text: &str) {
        let p = self.path(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    fn nodes(&self, lists: &[&str]) {
        for (i, l) in lists.iter().enumerate() {
            self.write(&format!("sys/devices/system/node/node{i}/cpulist"), l);
        }
    }

    /// A NIC `iface` on PCI function `pci` (a virtio NIC when `virtio`
    /// names its virtio device), with its queues and interrupts.
    fn nic(
        &mut self,
        iface: &str,
        pci: &str,
        virtio: Option<&str>,
        numa: i32,
        queues: usize,
        irqs: &[Irq],
    ) {
        let pci_dir = format!("sys/devices/pci0000:00/{pci}");
        let dev = match virtio {
            Some(v) => format!("{pci_dir}/{v}"),
            None => pci_dir.clone(),
        };
        std::fs::create_dir_all(self.path(&dev)).unwrap();
        self.write(&format!("{pci_dir}/numa_node"), &format!("{numa}\n"));
        for q in 0..queues {
            for kind in ["rx", "tx"] {
                std::fs::create_dir_all(
                    self.path(&format!("sys/class/net/{iface}/queues/{kind}-{q}")),
                )
                .unwrap();
            }
        }
        symlink(
            self.path(&dev),
            self.path(&format!("sys/class/net/{iface}/device")),
        )
        .unwrap();
        for (i, Irq(n, name, cpus)) in irqs.iter().enumerate() {
            self.write(&format!("{pci_dir}/msi_irqs/{n}"), "msix\n");
            self.write(&format!("proc/irq/{n}/smp_affinity_list"), "0-127\n");
            if self.effective {
                self.write(&format!("proc/irq/{n}/effective_affinity_list"), cpus);
            } else {
                self.write(&format!("proc/irq/{n}/smp_affinity_list"), cpus);
            }
            self.interrupts.push(format!(
                " {n:>3}:          0          0 PCI-MSIX-{pci}   {i}-edge      {name}"
            ));
        }
    }

    /// A virtual device (no `device/`), like `ifb0` or a bridge.
    fn virtual_nic(&self, iface: &str) {
        std::fs::create_dir_all(self.path(&format!("sys/class/net/{iface}/queues/rx-0"))).unwrap();
    }

    fn route(&self, iface: &str) {
        self.write(
            "proc/net/route",
            &format!(
                "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                 {iface}\t00000000\t0100000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
            ),
        );
    }

    fn discover(&self, affinity: Vec<usize>) -> Topology {
        let mut text = self.interrupts.join("\n");
        text.push_str("\nNMI:          0          0   Non-maskable interrupts\n");
        self.write("proc/interrupts", &text);
        discover_at(
            &Roots {
                sys: self.path("sys"),
                proc: self.path("proc"),
            },
            affinity,
        )
    }
}

fn place(topo: &Topology, threads: usize) -> crate::topology::Placement {
    let allowed = topo.allowed();
    worker_cpus(
        topo,
        &PlacementRequest {
            threads,
            allowed: &allowed,
            ..PlacementRequest::default()
        },
    )
}

#[test]
fn a_one_queue_virtio_vm_with_two_cpus() {
    let mut f = Fake::new();
    f.nodes(&["0-1\n"]);
    f.nic(
        "eth0",
        "0000:00:03.0",
        Some("virtio2"),
        -1,
        1,
        &[
            Irq(37, "virtio2-config", "0\n"),
            Irq(38, "virtio2-input.0", "1\n"),
            Irq(39, "virtio2-output.0", "0\n"),
        ],
    );
    f.virtual_nic("ifb0");
    f.virtual_nic("lo");
    f.route("eth0");
    let t = f.discover(vec![0, 1]);
    assert_eq!(t.nics.len(), 1, "{:?}", t.nics);
    let nic = &t.nics[0];
    assert_eq!(
        (nic.name.as_str(), nic.rx_queues, nic.tx_queues),
        ("eth0", 1, 1)
    );
    assert_eq!(nic.numa_node, None);
    assert_eq!(nic.irq_match, "names");
    assert_eq!(nic.queues[0].irq, Some(38));
    assert_eq!(nic.queues[0].irq_name.as_deref(), Some("virtio2-input.0"));
    assert_eq!(nic.queues[0].cpus, vec![1]);
    assert_eq!(
        t.nodes,
        vec![NumaNode {
            id: 0,
            cpus: vec![0, 1]
        }]
    );
    assert_eq!(t.cpuset, None);
    assert_eq!(t.default_route.as_deref(), Some("eth0"));
    assert_eq!(t.allowed(), vec![0, 1]);
    // The queue's CPU first, then the node's other CPU; the only node is
    // the arena's even though the NIC does not say.
    let p = place(&t, 1);
    assert_eq!(
        (p.cpus, p.why, p.numa_node),
        (Some(vec![1]), Why::NicQueues, Some(0))
    );
    let p = place(&t, 2);
    assert_eq!((p.cpus, p.why), (Some(vec![1, 0]), Why::Numa));
    assert_eq!(place(&t, 4).cpus, None);
}

/// 128 CPUs on two nodes; a 64-queue mlx5 NIC on node 1 whose queue `q`
/// interrupts CPU 64 + q, and a 2-queue NIC on node 0.
fn two_nodes(f: &mut Fake) {
    f.nodes(&["0-63\n", "64-127\n"]);
    let names: Vec<String> = (0..64)
        .map(|q| format!("mlx5_comp{q}@pci:0000:3b:00.0"))
        .collect();
    let cpus: Vec<String> = (0..64).map(|q| format!("{}\n", 64 + q)).collect();
    let mut irqs = vec![Irq(100, "mlx5_async0@pci:0000:3b:00.0", "64\n")];
    irqs.extend((0..64).map(|q| Irq(101 + q as u32, &names[q], &cpus[q])));
    f.nic("ens1f0", "0000:3b:00.0", None, 1, 64, &irqs);
    f.nic(
        "eno1",
        "0000:01:00.0",
        None,
        0,
        2,
        &[
            Irq(300, "eno1-TxRx-0", "0\n"),
            Irq(301, "eno1-TxRx-1", "1\n"),
        ],
    );
}

#[test]
fn a_64_queue_nic_over_two_numa_nodes() {
    let mut f = Fake::new();
    two_nodes(&mut f);
    let t = f.discover((0..128).collect());
    assert_eq!(t.nics.len(), 2);
    let mlx = t.nics.iter().find(|n| n.name == "ens1f0").unwrap();
    assert_eq!(
        (mlx.rx_queues, mlx.numa_node, mlx.irq_match),
        (64, Some(1), "names")
    );
    for (q, queue) in mlx.queues.iter().enumerate() {
        assert_eq!(queue.irq, Some(101 + q as u32));
        assert_eq!(queue.cpus, vec![64 + q]);
    }
    let eno = t.nics.iter().find(|n| n.name == "eno1").unwrap();
    assert_eq!(eno.queues[1].cpus, vec![1]);
    assert_eq!(t.nodes.len(), 2);
    // No route: the NIC with the most queues carries the data.
    assert_eq!(t.default_route, None);
    let p = place(&t, 8);
    assert_eq!(p.nic.as_deref(), Some("ens1f0"));
    assert_eq!(p.cpus, Some((64..72).collect()));
    assert_eq!((p.why, p.numa_node), (Why::NicQueues, Some(1)));
    let p = place(&t, 70);
    assert_eq!(p.why, Why::Allowed);
    assert_eq!(p.cpus.unwrap()[64..], [0, 1, 2, 3, 4, 5]);
    // The route names the small NIC: its queues' CPUs, on node 0.
    f.route("eno1");
    let t = f.discover((0..128).collect());
    let p = place(&t, 3);
    assert_eq!((p.cpus, p.numa_node), (Some(vec![0, 1, 2]), Some(0)));
}

#[test]
fn interrupts_all_on_cpu_0_when_irqbalance_is_off() {
    let mut f = Fake::new();
    f.nodes(&["0-7\n"]);
    let names: Vec<String> = (0..8).map(|q| format!("eth1-TxRx-{q}")).collect();
    let irqs: Vec<Irq> = (0..8)
        .map(|q| Irq(50 + q as u32, &names[q], "0\n"))
        .collect();
    // Only smp_affinity_list: an older kernel without effective affinity.
    f.effective = false;
    f.nic("eth1", "0000:02:00.0", None, 0, 8, &irqs);
    let t = f.discover((0..8).collect());
    let nic = &t.nics[0];
    assert!(
        nic.queues.iter().all(|q| q.cpus == vec![0]),
        "{:?}",
        nic.queues
    );
    let p = place(&t, 4);
    assert_eq!((p.cpus, p.why), (Some(vec![0, 1, 2, 3]), Why::Numa));
}

#[test]
fn a_restricted_cpuset() {
    let mut f = Fake::new();
    two_nodes(&mut f);
    f.write("proc/self/cgroup", "0::/job.slice/rank3\n");
    f.write("sys/fs/cgroup/cpuset.cpus.effective", "0-127\n");
    f.write(
        "sys/fs/cgroup/job.slice/rank3/cpuset.cpus.effective",
        "8-15,80-81\n",
    );
    let t = f.discover((0..128).collect());
    assert_eq!(t.cpuset, Some(vec![8, 9, 10, 11, 12, 13, 14, 15, 80, 81]));
    assert_eq!(t.affinity.len(), 128);
    let p = place(&t, 4);
    // Queue CPUs 80 and 81 are in the set; then the cpuset's others.
    assert_eq!((p.cpus, p.why), (Some(vec![80, 81, 8, 9]), Why::Allowed));
    let p = place(&t, 11);
    assert_eq!(p.cpus, None);
    assert_eq!(p.why.describe(), "none (11 threads > 10 CPUs)");
}

#[test]
fn unmatched_names_take_the_msi_interrupts_in_order() {
    let mut f = Fake::new();
    f.nodes(&["0-3\n"]);
    f.nic(
        "eth0",
        "0000:05:00.0",
        None,
        0,
        2,
        &[
            Irq(60, "fancy-config", "0\n"),
            Irq(61, "fancy-q-a", "2\n"),
            Irq(62, "fancy-q-b", "3\n"),
        ],
    );
    let t = f.discover((0..4).collect());
    let nic = &t.nics[0];
    assert_eq!(nic.irq_match, "msi-order");
    assert_eq!(nic.queues[0].irq, Some(61));
    assert_eq!(nic.queues[1].cpus, vec![3]);
}

#[test]
fn an_empty_tree_says_what_it_could_not_read() {
    let f = Fake::new();
    let t = discover_at(
        &Roots {
            sys: f.path("sys"),
            proc: f.path("proc"),
        },
        vec![0, 1],
    );
    assert!(t.nics.is_empty() && t.nodes.is_empty());
    assert!(
        t.unread.iter().any(|u| u.contains("interrupts")),
        "{:?}",
        t.unread
    );
    assert!(
        t.unread.iter().any(|u| u.contains("class/net")),
        "{:?}",
        t.unread
    );
    let p = place(&t, 2);
    assert_eq!(
        (p.cpus, p.why, p.numa_node),
        (Some(vec![0, 1]), Why::Allowed, None)
    );
}

#[test]
fn this_machine_reads_without_failing() {
    let t = discover();
    assert!(!t.affinity.is_empty());
    assert!(!t.allowed().is_empty());
}
