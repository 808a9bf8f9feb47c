"""Several nodes for real: two "nodes" and an object store as network
namespaces of this machine (a bridge, veth pairs, addresses of the test's
own), the S3-compatible server (examples/s3_server.rs) in the store's, a
node engine (`ringfeed node`) in each node's, and two ranks per node under
`torchrun --nnodes 2` (gloo across the namespaces), each attached to its
own node's engine over its socket. Every sample of the epoch is read
exactly once across the four ranks, and each node's ranks were served by
their own node's engine (its pid, from the consumer's stats). Then a node
dies mid-epoch (after each rank's checkpoint: its state after two
batches) and the job resumes elastically on the other node alone, two
ranks from all four states with an engine for the new layout: the samples
before the cut and after it are the epoch, none lost, none twice.

Needs root (network namespaces); where they cannot be made the test says
so and skips.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import cli, require, s3_server_binary, sample_bytes, skip_for_environment, write_tar

require("torch", "the several-nodes test")

SHARDS, PER_SHARD, BATCH = 4, 24, 8
BUCKET = "ringfeed-test"
ACCESS_KEY, SECRET_KEY = "AKIARINGFEEDTEST", "ringfeed-test-secret-0123456789abcdef"
HERE = Path(__file__).resolve().parent


def sh(*args, check=True):
    return subprocess.run(args, check=check, capture_output=True, text=True, timeout=60)


class Network:
    """Namespaces `store`, `node1`, `node2` on one bridge: 10.K.0.1, .2, .3."""

    def __init__(self):
        tag = os.getpid() % 10000
        self.net = 20 + os.getpid() % 200
        self.bridge = f"rfbr{tag}"
        self.names = {role: f"rf{role[0]}{i}-{tag}" for i, role in enumerate(["store", "node1", "node2"])}
        self.addr = {role: f"10.{self.net}.0.{i + 1}" for i, role in enumerate(["store", "node1", "node2"])}
        self.made = []
        # Each namespace's interface on the bridge (gloo is told to use it:
        # by default it takes the host name's address, loopback here).
        self.iface = {}

    def __enter__(self):
        try:
            sh("ip", "netns", "add", self.names["store"])
        except (subprocess.CalledProcessError, FileNotFoundError) as e:
            skip_for_environment(f"network namespaces cannot be made here: {getattr(e, 'stderr', e)}")
        self.made.append(self.names["store"])
        try:
            sh("ip", "link", "add", self.bridge, "type", "bridge")
            sh("ip", "link", "set", self.bridge, "up")
            for i, role in enumerate(["store", "node1", "node2"]):
                ns = self.names[role]
                if role != "store":
                    sh("ip", "netns", "add", ns)
                    self.made.append(ns)
                outer, inner = f"rfv{i}o{os.getpid() % 10000}", f"rfv{i}i{os.getpid() % 10000}"
                sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
                sh("ip", "link", "set", outer, "master", self.bridge)
                sh("ip", "link", "set", outer, "up")
                sh("ip", "link", "set", inner, "netns", ns)
                self.iface[role] = inner
                sh("ip", "-n", ns, "addr", "add", f"{self.addr[role]}/24", "dev", inner)
                sh("ip", "-n", ns, "link", "set", inner, "up")
                sh("ip", "-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def kill_all(self, role):
        """Kills every process in namespace `role` (torchrun's ranks run in
        process groups of their own: a namespace is the node)."""
        for _ in range(100):
            pids = sh("ip", "netns", "pids", self.names[role], check=False).stdout.split()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        raise AssertionError(f"processes of {role} survive SIGKILL: {pids}")

    def __exit__(self, *exc):
        for role, ns in self.names.items():
            if ns in self.made:
                self.kill_all(role)
        for ns in self.made:
            sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", self.bridge, check=False)

    def run(self, role, args, **kw):
        """`args` in namespace `role`, in a process group of its own (so
        torchrun's ranks go with it)."""
        return subprocess.Popen(["ip", "netns", "exec", self.names[role], *map(str, args)],
                                start_new_session=True, **kw)


class Job:
    """The dataset in the store, the network, the S3 server, and the node
    engines and torchrun jobs started in the nodes (all killed at the end)."""

    def __init__(self, tmp_path, net):
        self.tmp, self.net, self.procs = tmp_path, net, []
        root = tmp_path / "store"
        (root / BUCKET).mkdir(parents=True)
        self.keys = []
        for s in range(SHARDS):
            members = []
            for j in range(PER_SHARD):
                key = f"s{s}/{j:04d}"
                self.keys.append(key)
                members += [(f"{key}.bin", sample_bytes(key, "bin", 2000 + 37 * j)), (f"{key}.cls", str(j).encode())]
            write_tar(root / BUCKET / f"shard-{s:03d}.tar", members)
        # Splitting an epoch among consumers needs the shards' sample
        # counts: a manifest gives them (as `ringfeed index` writes it).
        self.url = str(tmp_path / "train.manifest")
        Path(self.url).write_text("".join(
            f"s3://{BUCKET}/shard-{s:03d}.tar {(root / BUCKET / f'shard-{s:03d}.tar').stat().st_size} {PER_SHARD}\n"
            for s in range(SHARDS)))
        store = self.start("store", [s3_server_binary(), root, "--addr", net.addr["store"]],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(tmp_path / "s3.log", "wb"))
        endpoint = store.stdout.readline().decode().strip()
        assert endpoint.startswith(f"http://{net.addr['store']}:"), endpoint
        # The job's keys, which the engines and the ranks agree on.
        self.job = {"batch_size": BATCH, "seed": 5, "shuffle": True, "s3_endpoint": endpoint,
                    "s3_region": "us-east-1"}
        self.env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
                        OMP_NUM_THREADS="1")
        self.out = tmp_path / "out"
        self.out.mkdir()

    def start(self, role, args, **kw):
        p = self.net.run(role, args, **kw)
        self.procs.append(p)
        return p

    def engine(self, node, world, tag):
        """A node engine in `node` for `world` ranks (no DataLoader workers,
        the dataset's default I/O threads); its process and socket."""
        socket = self.tmp / f"{node}-{tag}.sock"
        config = dict(self.job, world_size=world, loader_workers=1, workers=4, memory_budget="64MiB",
                      chunk_size="1MiB")
        log = self.tmp / f"{node}-{tag}.log"
        p = self.start(node, [cli(), "node", self.url, "--socket", socket, "--config", json.dumps(config)],
                       env=self.env, stdout=subprocess.DEVNULL, stderr=open(log, "wb"))
        for _ in range(600):
            if socket.exists() or p.poll() is not None:
                break
            time.sleep(0.1)
        assert socket.exists(), log.read_text()
        return p, socket

    def torchrun(self, mode, nodes, sockets, extra=()):
        """`multinode_rank.py MODE` as node i of len(nodes) in each node."""
        exe = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
        port = 29400 + (os.getpid() + len(mode)) % 500
        runs = []
        for i, node in enumerate(nodes):
            args = [exe, "--nnodes", len(nodes), "--nproc-per-node", 2, "--node-rank", i,
                    "--master-addr", self.net.addr[nodes[0]], "--master-port", port,
                    HERE / "multinode_rank.py", mode, sockets[node], self.out, self.url, json.dumps(self.job),
                    *extra]
            runs.append(self.start(node, args, env=dict(self.env, GLOO_SOCKET_IFNAME=self.net.iface[node]),
                                   stdout=open(self.tmp / f"{mode}-{node}.out", "wb"), stderr=subprocess.STDOUT))
        return runs

    def results(self, mode, ranks):
        return [json.loads((self.out / f"{mode}-rank{r}.json").read_text()) for r in range(ranks)]

    def kill(self, p):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()

    def close(self):
        for role in ("node1", "node2", "store"):
            self.net.kill_all(role)
        for p in self.procs:
            self.kill(p)


def finish(job, runs, mode):
    for p, node in zip(runs, ("node1", "node2")):
        try:
            p.wait(timeout=240)
        except subprocess.TimeoutExpired:
            job.kill(p)
        assert p.returncode == 0, (job.tmp / f"{mode}-{node}.out").read_text()[-4000:]


def test_two_nodes_each_serving_its_own_ranks_read_every_sample_once(tmp_path):
    if os.geteuid() != 0:
        skip_for_environment("network namespaces need root")
    with Network() as net:
        job = Job(tmp_path, net)
        try:
            engines = {node: job.engine(node, 4, "a") for node in ("node1", "node2")}
            runs = job.torchrun("epoch", ["node1", "node2"], {n: s for n, (_, s) in engines.items()})
            finish(job, runs, "epoch")
            got = job.results("epoch", 4)
        finally:
            job.close()
    every = [k for g in got for k in g["keys"]]
    print({g["rank"]: len(g["keys"]) for g in got}, "samples a rank;",
          {g["rank"]: g["engine"]["pid"] for g in got}, "engine pids")
    assert sorted(every) == sorted(job.keys), "every sample exactly once across the four ranks"
    assert all(g["world"] == 4 and g["total"] == len(job.keys) for g in got)
    # Each node's ranks were served by their own node's engine: its pid
    # (`ip netns exec` runs the engine as itself) and its socket.
    served = {g["rank"]: g["engine"]["pid"] for g in got}
    assert served[0] == served[1] and served[2] == served[3] and served[0] != served[2], served
    for r, node in ((0, "node1"), (2, "node2")):
        assert got[r]["engine"]["socket"] == str(engines[node][1]), got[r]["engine"]
        assert served[r] == engines[node][0].pid, (served, engines)


def test_a_node_killed_mid_epoch_and_the_job_resumed_on_the_other_loses_and_repeats_nothing(tmp_path):
    if os.geteuid() != 0:
        skip_for_environment("network namespaces need root")
    with Network() as net:
        job = Job(tmp_path, net)
        try:
            engines = {node: job.engine(node, 4, "a") for node in ("node1", "node2")}
            runs = job.torchrun("cut", ["node1", "node2"], {n: s for n, (_, s) in engines.items()})
            # Every rank checkpointed after its second batch (its state);
            # then node 2 dies: its engine and its ranks, killed.
            for _ in range(2400):
                if len(list(job.out.glob("cut-rank*.json"))) == 4 or any(p.poll() is not None for p in runs):
                    break
                time.sleep(0.1)
            cut = job.results("cut", 4)
            net.kill_all("node2")
            # The job restarts on node 1 alone (as torchrun's elastic agent
            # would): its ranks stop, and two ranks resume from all four
            # states with a node engine for the new layout.
            net.kill_all("node1")
            for p in [*runs, *(e for e, _ in engines.values())]:
                p.wait()
            engine, socket = job.engine("node1", 2, "b")
            states = json.dumps([g["state"] for g in sorted(cut, key=lambda g: g["rank"])])
            runs = job.torchrun("resume", ["node1"], {"node1": socket}, extra=[states])
            finish(job, runs, "resume")
            rest = job.results("resume", 2)
        finally:
            job.close()
    before = [k for g in cut for k in g["keys"]]
    after = [k for g in rest for k in g["keys"]]
    print(f"{len(before)} samples before the cut on 4 ranks, {len(after)} after on 2:",
          {g["rank"]: len(g["keys"]) for g in rest})
    assert all(len(g["keys"]) == 2 * BATCH for g in cut)
    assert all(g["world"] == 2 and g["engine"]["pid"] == engine.pid for g in rest)
    assert not set(before) & set(after), "a sample delivered before the cut came again"
    assert sorted(before + after) == sorted(job.keys), "every sample of the epoch exactly once"
