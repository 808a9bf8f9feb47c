//! `ringfeed topology`: what the engine reads of this machine (NICs, their
//! queues and the CPUs that take their interrupts, NUMA nodes, the CPUs
//! this process may use) and the CPUs a loader with `--workers N` would be
//! pinned to now, other engines' claims included; as text or `--json`.

use ringfeed::config::AUTO_WORKERS;
use ringfeed::topology::{self, ClaimsDir, PlacementRequest, Topology, format_cpu_list};
use serde_json::json;

use crate::AnyResult;
use crate::args::TopologyArgs;

pub(crate) fn topology_cmd(a: TopologyArgs) -> AnyResult<()> {
    let topo = topology::discover();
    let allowed = topo.allowed();
    let workers = a.workers.unwrap_or(AUTO_WORKERS);
    let (claimed, claims_note) = match ClaimsDir::for_user() {
        Ok(dir) => (dir.claimed(&allowed), format!("{}", dir.path().display())),
        Err(e) => (Vec::new(), format!("unavailable ({e})")),
    };
    let p = topology::worker_cpus(
        &topo,
        &PlacementRequest {
            threads: workers,
            allowed: &allowed,
            claimed: &claimed,
            ..PlacementRequest::default()
        },
    );
    if a.json {
        let out = json!({
            "topology": topo,
            "allowed": allowed,
            "claimed": claimed,
            "claims_dir": claims_note,
            "placement": {
                "workers": workers,
                "cpus": p.cpus,
                "placement": p.why.describe(),
                "nic": p.nic,
                "numa_node": p.numa_node,
            },
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    print_text(&topo, &allowed);
    println!(
        "claimed by other engines: {} (claims in {claims_note})",
        list_or_none(&claimed)
    );
    let node = p.numa_node.map_or("unknown".into(), |n| n.to_string());
    let nic = p.nic.as_deref().unwrap_or("none");
    match &p.cpus {
        Some(cpus) => println!(
            "placement of {workers} workers: CPUs {} ({}); NIC {nic}, NUMA node {node}",
            cpus.iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(","),
            p.why.describe()
        ),
        None => println!(
            "placement of {workers} workers: {}; NIC {nic}, NUMA node {node}",
            p.why.describe()
        ),
    }
    Ok(())
}

fn list_or_none(cpus: &[usize]) -> String {
    match cpus {
        [] => "none".into(),
        c => format_cpu_list(c),
    }
}

fn print_text(topo: &Topology, allowed: &[usize]) {
    let cpuset = topo
        .cpuset
        .as_deref()
        .map_or("none".into(), format_cpu_list);
    println!(
        "CPUs allowed: {} (affinity {}, cgroup cpuset {cpuset})",
        list_or_none(allowed),
        list_or_none(&topo.affinity)
    );
    if topo.nodes.is_empty() {
        println!("NUMA nodes: none read");
    }
    for n in &topo.nodes {
        println!("NUMA node {}: CPUs {}", n.id, list_or_none(&n.cpus));
    }
    if topo.nics.is_empty() {
        println!("NICs: none with a device (virtual interfaces are left out)");
    }
    for nic in &topo.nics {
        println!(
            "NIC {} ({}): NUMA node {}, {} rx / {} tx queues, interrupts by {}",
            nic.name,
            nic.driver.as_deref().unwrap_or("driver unknown"),
            nic.numa_node.map_or("unknown".into(), |n| n.to_string()),
            nic.rx_queues,
            nic.tx_queues,
            nic.irq_match
        );
        for q in &nic.queues {
            println!(
                "  rx-{}: irq {} {} CPUs {}",
                q.index,
                q.irq.map_or("?".into(), |i| i.to_string()),
                q.irq_name.as_deref().unwrap_or("-"),
                list_or_none(&q.cpus)
            );
        }
    }
    println!(
        "default route: {}",
        topo.default_route.as_deref().unwrap_or("none")
    );
    for u in &topo.unread {
        println!("not read: {u}");
    }
}
