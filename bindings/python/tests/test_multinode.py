"""Several nodes for real: two "nodes" and an object store as network
namespaces of this machine (a bridge, veth pairs, addresses of the test's
own), the S3-compatible server (examples/s3_server.rs) in the store's, a
node engine (`ringfeed node`) in each node's, and two ranks per node under
`torchrun --nnodes 2` (gloo across the namespaces), each attached to its
own node's engine over its socket. Every sample of the epoch is read
exactly once across the four ranks, and each node's ranks were served by
their own node's engine (its pid, from the consumer's stats).

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

    def __exit__(self, *exc):
        for ns in self.made:
            sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", self.bridge, check=False)

    def run(self, role, args, **kw):
        """`args` in namespace `role`, in a process group of its own (so
        torchrun's ranks go with it)."""
        return subprocess.Popen(["ip", "netns", "exec", self.names[role], *map(str, args)],
                                start_new_session=True, **kw)


def test_two_nodes_each_serving_its_own_ranks_read_every_sample_once(tmp_path):
    if os.geteuid() != 0:
        skip_for_environment("network namespaces need root")
    root = tmp_path / "store"
    (root / BUCKET).mkdir(parents=True)
    keys = []
    for s in range(SHARDS):
        members = []
        for j in range(PER_SHARD):
            key = f"s{s}/{j:04d}"
            keys.append(key)
            members += [(f"{key}.bin", sample_bytes(key, "bin", 2000 + 37 * j)), (f"{key}.cls", str(j).encode())]
        write_tar(root / BUCKET / f"shard-{s:03d}.tar", members)
    # Splitting an epoch among consumers needs the shards' sample counts:
    # a manifest gives them (as `ringfeed index` writes it).
    url = str(tmp_path / "train.manifest")
    Path(url).write_text("".join(
        f"s3://{BUCKET}/shard-{s:03d}.tar {(root / BUCKET / f'shard-{s:03d}.tar').stat().st_size} {PER_SHARD}\n"
        for s in range(SHARDS)))
    procs = []
    with Network() as net:
        try:
            store = net.run("store", [s3_server_binary(), root, "--addr", net.addr["store"]],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(tmp_path / "s3.log", "wb"))
            procs.append(store)
            endpoint = store.stdout.readline().decode().strip()
            assert endpoint == f"http://{net.addr['store']}:" + endpoint.rsplit(":", 1)[-1], endpoint
            # The job's keys, which the engines and the ranks agree on; four
            # ranks, no DataLoader workers, the dataset's default I/O threads.
            job = {"batch_size": BATCH, "seed": 5, "shuffle": True, "s3_endpoint": endpoint,
                   "s3_region": "us-east-1"}
            env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
                       OMP_NUM_THREADS="1")
            engines = {}
            for node in ("node1", "node2"):
                socket = tmp_path / f"{node}.sock"
                config = dict(job, world_size=4, loader_workers=1, workers=4, memory_budget="64MiB",
                              chunk_size="1MiB")
                engines[node] = (net.run(node, [cli(), "node", url, "--socket", socket, "--config", json.dumps(config)],
                                         env=env, stdout=subprocess.DEVNULL,
                                         stderr=open(tmp_path / f"{node}.log", "wb")), socket)
                procs.append(engines[node][0])
            for node, (p, socket) in engines.items():
                for _ in range(600):
                    if socket.exists() or p.poll() is not None:
                        break
                    time.sleep(0.1)
                assert socket.exists(), (tmp_path / f"{node}.log").read_text()
            torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
            out = tmp_path / "out"
            out.mkdir()
            ranks = []
            for i, node in enumerate(("node1", "node2")):
                args = [torchrun, "--nnodes", 2, "--nproc-per-node", 2, "--node-rank", i,
                        "--master-addr", net.addr["node1"], "--master-port", 29400 + os.getpid() % 500,
                        HERE / "multinode_rank.py", engines[node][1], out, url, json.dumps(job)]
                ranks.append(net.run(node, args, env=dict(env, GLOO_SOCKET_IFNAME=net.iface[node]),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
                procs.append(ranks[-1])
            for p in ranks:
                text = p.communicate(timeout=240)[0].decode(errors="replace")
                assert p.returncode == 0, text[-4000:]
            got = [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]
        finally:
            for p in procs:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
    every = [k for g in got for k in g["keys"]]
    print({g["rank"]: len(g["keys"]) for g in got}, "samples a rank;",
          {g["rank"]: g["engine"]["pid"] for g in got}, "engine pids")
    assert sorted(every) == sorted(keys), "every sample exactly once across the four ranks"
    assert all(g["world"] == 4 and g["total"] == len(keys) for g in got)
    pids = {node: p.pid for node, (p, _) in engines.items()}
    # `ip netns exec` runs the engine as its own process: the pid torchrun's
    # ranks were served by is the engine's, in its node.
    served = {g["rank"]: g["engine"]["pid"] for g in got}
    assert served[0] == served[1] and served[2] == served[3] and served[0] != served[2], served
    for r, node in ((0, "node1"), (2, "node2")):
        assert got[r]["engine"]["socket"] == str(engines[node][1]), got[r]["engine"]
        assert served[r] == pids[node], (served, pids)
