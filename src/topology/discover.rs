//! Reads the machine's topology from `/sys` and `/proc` under given roots
//! (the real ones, or a fake tree in tests). A file that is missing or
//! unparsable is never an error: what could not be read goes into
//! [`Topology::unread`] and the rest is still filled in.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{Nic, NumaNode, Queue, Topology, allowed_cpus, parse_cpu_list};

/// Where `/sys` and `/proc` are.
#[derive(Debug, Clone)]
pub struct Roots {
    pub sys: PathBuf,
    pub proc: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Roots {
            sys: "/sys".into(),
            proc: "/proc".into(),
        }
    }
}

/// This machine's topology, for this process.
pub fn discover() -> Topology {
    discover_at(&Roots::default(), allowed_cpus())
}

/// The topology under `roots`, with `affinity` as the process's mask (the
/// mask is a system call, not a file: tests pass their own).
pub fn discover_at(roots: &Roots, affinity: Vec<usize>) -> Topology {
    let mut unread = Vec::new();
    let irq_names = interrupt_names(&roots.proc, &mut unread);
    let nics = nics(roots, &irq_names, &mut unread);
    let nodes = numa_nodes(&roots.sys, &mut unread);
    let cpuset = cpuset(roots, &mut unread);
    let default_route = default_route(&roots.proc, &mut unread);
    Topology {
        nics,
        nodes,
        affinity,
        cpuset,
        default_route,
        unread,
    }
}

/// A file's text, or a line in `unread` saying why not.
fn read(path: &Path, unread: &mut Vec<String>) -> Option<String> {
    match std::fs::read_to_string(path) {
        Ok(t) => Some(t),
        Err(e) => {
            unread.push(format!("{}: {e}", path.display()));
            None
        }
    }
}

/// A CPU list file, or a line in `unread`.
fn read_cpus(path: &Path, unread: &mut Vec<String>) -> Option<Vec<usize>> {
    let text = read(path, unread)?;
    match parse_cpu_list(&text) {
        Ok(cpus) => Some(cpus),
        Err(e) => {
            unread.push(format!("{}: {e}", path.display()));
            None
        }
    }
}

/// The names of `/proc/interrupts`, by interrupt number: the last word of
/// each numbered line (the handler's name: `virtio2-input.0`,
/// `mlx5_comp3@pci:0000:3b:00.0`, `eth0-TxRx-3`).
fn interrupt_names(proc: &Path, unread: &mut Vec<String>) -> BTreeMap<u32, String> {
    let Some(text) = read(&proc.join("interrupts"), unread) else {
        return BTreeMap::new();
    };
    text.lines()
        .filter_map(|line| {
            let (num, rest) = line.trim_start().split_once(':')?;
            let irq = num.parse::<u32>().ok()?;
            let name = rest.split_whitespace().last()?;
            Some((irq, name.trim_end_matches(',').to_string()))
        })
        .collect()
}

/// Numbered entries of a directory (`msi_irqs/37`, `node0`), ascending.
fn numbered(dir: &Path, prefix: &str) -> Option<Vec<u32>> {
    let mut out: Vec<u32> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.strip_prefix(prefix)?.parse().ok())
        .collect();
    out.sort_unstable();
    Some(out)
}

fn nics(roots: &Roots, irq_names: &BTreeMap<u32, String>, unread: &mut Vec<String>) -> Vec<Nic> {
    let class = roots.sys.join("class/net");
    let Ok(entries) = std::fs::read_dir(&class) else {
        unread.push(format!("{}: cannot list", class.display()));
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n != "lo")
        .collect();
    names.sort();
    names
        .into_iter()
        .filter_map(|name| nic(roots, &class.join(&name), name, irq_names, unread))
        .collect()
}

/// One NIC, or `None` for a virtual device (no `device/`: bridges, veth,
/// ifb, tunnels).
fn nic(
    roots: &Roots,
    dir: &Path,
    name: String,
    irq_names: &BTreeMap<u32, String>,
    unread: &mut Vec<String>,
) -> Option<Nic> {
    let dev = dir.join("device");
    if !dev.exists() {
        return None;
    }
    // A virtio NIC's `device` is the virtio device (`virtio2`); its PCI
    // function, one level up, has the MSI interrupts and the NUMA node.
    let dev_name = std::fs::canonicalize(&dev)
        .ok()
        .and_then(|p| Some(p.file_name()?.to_str()?.to_string()))
        .unwrap_or_default();
    let parent = dev.join("..");
    let driver = std::fs::read_link(dev.join("driver"))
        .ok()
        .and_then(|p| Some(p.file_name()?.to_str()?.to_string()));
    let numa_file = [dev.join("numa_node"), parent.join("numa_node")]
        .into_iter()
        .find(|p| p.exists());
    let numa_node = match numa_file {
        Some(p) => read(&p, unread).and_then(|t| t.trim().parse::<usize>().ok()),
        None => {
            unread.push(format!("{}: no numa_node", dev.display()));
            None
        }
    };
    let queue_names: Vec<String> = std::fs::read_dir(dir.join("queues"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_else(|_| {
            unread.push(format!("{}: cannot list", dir.join("queues").display()));
            Vec::new()
        });
    let rx_queues = queue_names.iter().filter(|q| q.starts_with("rx-")).count();
    let tx_queues = queue_names.iter().filter(|q| q.starts_with("tx-")).count();
    let msi =
        numbered(&dev.join("msi_irqs"), "").or_else(|| numbered(&parent.join("msi_irqs"), ""));
    if msi.is_none() {
        unread.push(format!("{}: no msi_irqs", dev.display()));
    }
    let (irqs, irq_match) = queue_irqs(&name, &dev_name, rx_queues, msi.as_deref(), irq_names);
    let queues = (0..rx_queues)
        .map(|index| {
            let irq = irqs.get(index).copied().flatten();
            let cpus = irq
                .and_then(|irq| irq_cpus(&roots.proc, irq, unread))
                .unwrap_or_default();
            Queue {
                index,
                irq,
                irq_name: irq.and_then(|i| irq_names.get(&i).cloned()),
                cpus,
            }
        })
        .collect();
    Some(Nic {
        name,
        driver,
        numa_node,
        rx_queues,
        tx_queues,
        queues,
        irq_match,
    })
}

/// The receive queue an interrupt's name is for, by the names drivers
/// give: virtio `virtio2-input.3`, mlx5 `mlx5_comp3@pci:…`, Intel and
/// others `eth0-TxRx-3`, `eth0-rx-3`, `eth0-Tx-Rx-3`.
fn queue_of(irq_name: &str, iface: &str, dev_name: &str) -> Option<usize> {
    if !dev_name.is_empty()
        && let Some(q) = irq_name
            .strip_prefix(dev_name)
            .and_then(|r| r.strip_prefix("-input."))
    {
        return q.parse().ok();
    }
    if let Some(rest) = irq_name.strip_prefix("mlx5_comp") {
        return rest.split('@').next()?.parse().ok();
    }
    let rest = irq_name.strip_prefix(iface)?.strip_prefix('-')?;
    let (kind, q) = rest.rsplit_once('-')?;
    kind.to_ascii_lowercase()
        .contains("rx")
        .then(|| q.parse().ok())
        .flatten()
}

/// Names of interrupts that serve no queue (configuration, control,
/// mailbox), left out when the MSI interrupts are taken in order.
fn serves_no_queue(name: &str) -> bool {
    ["config", "async", "ctrl", "mbx", "misc", "output", "event"]
        .iter()
        .any(|w| name.contains(w))
}

/// The interrupt of each receive queue, and how they were found.
fn queue_irqs(
    iface: &str,
    dev_name: &str,
    rx_queues: usize,
    msi: Option<&[u32]>,
    irq_names: &BTreeMap<u32, String>,
) -> (Vec<Option<u32>>, &'static str) {
    let mut by_name = vec![None; rx_queues];
    let mut matched = false;
    // The device's own interrupts when it lists them; else every named one
    // (then only names that carry the interface's or device's name count).
    let candidates: Vec<u32> = match msi {
        Some(m) => m.to_vec(),
        None => irq_names.keys().copied().collect(),
    };
    for &irq in &candidates {
        let Some(name) = irq_names.get(&irq) else {
            continue;
        };
        if msi.is_none() && !name.starts_with(iface) && !name.starts_with(dev_name) {
            continue;
        }
        if let Some(q) = queue_of(name, iface, dev_name)
            && q < rx_queues
            && by_name[q].is_none()
        {
            by_name[q] = Some(irq);
            matched = true;
        }
    }
    if matched {
        return (by_name, "names");
    }
    match msi {
        Some(m) if !m.is_empty() => {
            let in_order: Vec<Option<u32>> = m
                .iter()
                .copied()
                .filter(|irq| irq_names.get(irq).is_none_or(|n| !serves_no_queue(n)))
                .map(Some)
                .take(rx_queues)
                .collect();
            (in_order, "msi-order")
        }
        _ => (Vec::new(), "none"),
    }
}

/// The CPUs that take interrupt `irq`.
fn irq_cpus(proc: &Path, irq: u32, unread: &mut Vec<String>) -> Option<Vec<usize>> {
    let dir = proc.join("irq").join(irq.to_string());
    let effective = dir.join("effective_affinity_list");
    if let Ok(text) = std::fs::read_to_string(&effective)
        && let Ok(cpus) = parse_cpu_list(&text)
        && !cpus.is_empty()
    {
        return Some(cpus);
    }
    read_cpus(&dir.join("smp_affinity_list"), unread)
}

fn numa_nodes(sys: &Path, unread: &mut Vec<String>) -> Vec<NumaNode> {
    let dir = sys.join("devices/system/node");
    let Some(ids) = numbered(&dir, "node") else {
        unread.push(format!("{}: cannot list", dir.display()));
        return Vec::new();
    };
    ids.into_iter()
        .map(|id| NumaNode {
            id: id as usize,
            cpus: read_cpus(&dir.join(format!("node{id}/cpulist")), unread).unwrap_or_default(),
        })
        .collect()
}

/// The cgroup's effective cpuset: this process's cgroup (v2, from
/// `/proc/self/cgroup`), else the root's, else cgroup v1's cpuset
/// controller. `None` when no such file exists.
fn cpuset(roots: &Roots, unread: &mut Vec<String>) -> Option<Vec<usize>> {
    let cg = roots.sys.join("fs/cgroup");
    let own = std::fs::read_to_string(roots.proc.join("self/cgroup"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("0::").map(|p| p.trim().to_string()))
        })
        .map(|p| {
            cg.join(p.trim_start_matches('/'))
                .join("cpuset.cpus.effective")
        });
    let file = own
        .into_iter()
        .chain([
            cg.join("cpuset.cpus.effective"),
            cg.join("cpuset/cpuset.effective_cpus"),
        ])
        .find(|p| p.exists())?;
    read_cpus(&file, unread)
}

/// The interface of the IPv4 default route (`/proc/net/route`: destination
/// and mask 0).
fn default_route(proc: &Path, unread: &mut Vec<String>) -> Option<String> {
    let text = read(&proc.join("net/route"), unread)?;
    text.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 7 && f[1] == "00000000" && f[7] == "00000000").then(|| f[0].to_string())
    })
}

#[cfg(test)]
mod tests;
