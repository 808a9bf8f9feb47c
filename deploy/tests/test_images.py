"""The images built and run here, with no registry and no Docker daemon.

A base image made from Debian's packages (docker/debian-base.sh:
mmdebstrap), the two images of docker/Dockerfile built on it from the
release build (docker/build-images.sh, podman), then the DaemonSet's and
the Job's containers run from them under podman with runc, each as the
manifests say (pods.py: user, capabilities, read-only root, seccomp
profile, mounts): the init containers, the engine and a trainer, on host
folders made as the kubelet makes them (root's, 0755), the engine reading
from the S3 test server (examples/s3_server.rs) in a network namespace the
test makes, the trainer with no network at all.

- Both images are built, named as kustomization.yaml's `images:` says, and
  run as the user the pods run as.
- The init containers install the seccomp profile and give the socket's
  folder and the cache to the engine's user; the engine then streams on
  io_uring under the profile, and the trainer gets every sample of the
  epoch, every byte the shards hold, through the socket; the cache fills,
  its entries the engine user's.
- The engine SIGKILLed mid-epoch: the attached trainer fails with
  `ringfeed.NodeError` naming the engine's exit (it does not reconnect: a
  training job restarts its ranks from their checkpoints); the socket
  stays, and nobody answers on it. Started again, the engine replaces it,
  and a new trainer gets the same epoch from the cache. `podman stop`
  (SIGTERM) then stops it with status 0, its socket removed.
- Controls, each on a fresh node: without the init container that gives
  the folders to the engine's user, the engine cannot bind and names the
  folder, its owner and mode; with the cache still root's, the trainer is
  refused naming the cache and its owner; with `lock_memory: on`, the
  engine (a container of uid 10001, so without IPC_LOCK, and a pod's
  8 MiB memlock limit) fails naming mlock.

Needs root, podman, runc and mmdebstrap (scripts/test.sh installs them
from Debian's packages, or says why it cannot and skips this file), and
the release build and the S3 test server's build that test.sh makes
before. The steps' times are printed; docs/containers-and-abi-checks.md
gives them.
"""

import hashlib
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

import pods
from manifests import REPO, documents, images, pod_specs, security

BASE = "localhost/ringfeed-base:bookworm"
BUCKET = "ringfeed-test"
ACCESS_KEY, SECRET_KEY = "AKIARINGFEEDTEST", "ringfeed-test-secret-0123456789abcdef"
SHARDS = 4
URLS = f"s3://{BUCKET}/train/shard-{{000000..{SHARDS - 1:06d}}}.tar"
# The ConfigMap's engine.json with what this test's machine has instead:
# the S3 test server's data, one consumer taking the whole epoch (so its
# samples are exactly the shards'), a small budget in normal pages (no huge
# pages reserved here), and every shard cached whatever the disk's free
# space (the machine's disk may be fuller than the engine's default floor).
TEST_KEYS = {
    "urls": URLS,
    "world_size": 1,
    "loader_workers": 1,
    "memory_budget": "256MiB",
    "memory_kind": "auto",
    "cache_fill": "always",
    "cache_min_free": 0,
}
# The keys a consumer must give as the engine has them.
JOB_KEYS = ("urls", "s3_endpoint", "batch_size", "shuffle", "shuffle_buffer", "seed", "world_size",
            "workers", "loader_workers")
ENGINE_UID = 10001
# What the trainer container runs instead of the Job's torchrun (16 ranks
# on GPUs; the test's trainer image has no PyTorch): the package streaming
# through the engine's socket, as train.py's loaders do. "epoch": every
# sample's fields hashed, and the stats. "hold": epochs for ever, a line
# once attached, then the error that ends it.
TRAINER = """
import hashlib, json, sys
import ringfeed
cfg = json.loads(sys.argv[1])
mode, urls = cfg.pop("mode"), cfg.pop("urls")
if mode == "hold":
    cfg["epochs"] = 0
samples, batches = {}, 0
try:
    with ringfeed.Loader(urls, node="/run/ringfeed/node.sock", **cfg) as loader:
        for b in loader:
            with b:
                for name in b.fields:
                    v = b[name]
                    for i, k in enumerate(b.keys):
                        if v[i] is not None and mode == "epoch":
                            samples.setdefault(k, {})[name] = hashlib.sha256(bytes(v[i])).hexdigest()
            batches += 1
            if batches == 1 and mode == "hold":
                print("attached", flush=True)
        stats = loader.stats()
except ringfeed.Error as e:
    print(json.dumps({"error": type(e).__name__, "message": str(e), "batches": batches}), flush=True)
    sys.exit(3)
print(json.dumps({"samples": samples, "stats": stats}), flush=True)
"""


def need(condition, why):
    if not condition:
        pytest.fail(f"the image test cannot run: {why} (scripts/test.sh installs what it needs, "
                    "or says why it cannot and skips it)", pytrace=False)


class Podman:
    """podman on a storage of the test's own (nothing of the machine's
    images is read or left), running containers with runc, as containerd
    does on EKS (Debian 12's crun also refuses a host whose cgroup v2
    hierarchy holds a controller beside v1's), and building with chroot
    isolation (RUN steps without a runtime or cgroups, which the builds
    do not test)."""

    def __init__(self, work):
        self.work = work
        conf = work / "storage.conf"
        conf.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{work / "graph"}"\n'
                        f'runroot = "{work / "runroot"}"\n')
        self.env = {**os.environ, "CONTAINERS_STORAGE_CONF": str(conf), "BUILDAH_ISOLATION": "chroot",
                    "PYTHON": sys.executable}
        self.names = []

    def __call__(self, *args, timeout=120, check=True):
        done = subprocess.run(["podman", "--runtime", "runc", *map(str, args)], capture_output=True,
                              text=True, timeout=timeout, env=self.env)
        if check and done.returncode != 0:
            raise AssertionError(f"podman {' '.join(map(str, args))}: {done.returncode}\n{done.stdout}{done.stderr}")
        return done

    def name(self, what):
        name = f"rf-images-{os.getpid()}-{what}"
        self.names.append(name)
        return name

    def logs(self, name):
        done = self("logs", name, check=False)
        return done.stdout + done.stderr

    def wait_log(self, name, text, count=1):
        """Waits until `name`'s log holds `text` `count` times; fails if the
        container stops first, or after 60 s."""
        deadline = time.monotonic() + 60
        while True:
            logs = self.logs(name)
            if logs.count(text) >= count:
                return logs
            running = self("inspect", "--format", "{{.State.Running}}", name).stdout.strip()
            assert running == "true", f"{name} stopped before saying {text!r}:\n{logs}"
            assert time.monotonic() < deadline, f"{name} did not say {text!r} in 60 s:\n{logs}"
            time.sleep(0.1)

    def clean(self):
        self("rm", "--all", "--force", timeout=300, check=False)
        self("rmi", "--all", "--force", timeout=300, check=False)


class Cluster:
    """One node's worth of pods: the manifests, the S3 server's endpoint,
    and podman."""

    def __init__(self, podman, work, netns, endpoint):
        self.podman, self.work, self.netns, self.endpoint = podman, work, netns, endpoint
        docs = documents()
        self.pods = pod_specs(docs)
        self.configmap = docs[("ConfigMap", "ringfeed-node")]["data"]
        self.shipped = json.loads(self.configmap["engine.json"])
        self.config = {**self.shipped, **TEST_KEYS, "s3_endpoint": endpoint}

    def node(self, name, **config):
        """A fresh node (its host folders as the kubelet makes them), whose
        engine has the test's configuration with `config` over it."""
        data = dict(self.configmap, **{"engine.json": json.dumps({**self.config, **config})})
        return pods.Node(self.work / name, {"ringfeed-node": data})

    def init(self, node, container):
        args = pods.run_args(self.pods["node engine"], container, node, "none")
        return self.podman("run", "--rm", "--name", self.podman.name(f"{node.root.name}-{container}"), *args)

    def engine_args(self, node):
        return pods.run_args(self.pods["node engine"], "engine", node, f"ns:/run/netns/{self.netns}",
                             env={"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY})

    def start_engine(self, node):
        name = self.podman.name(f"{node.root.name}-engine")
        self.podman("run", "--detach", "--name", name, *self.engine_args(node))
        self.podman.wait_log(name, "ringfeed node: listening on /run/ringfeed/node.sock")
        return name

    def trainer_args(self, node, mode):
        cfg = {k: self.config[k] for k in JOB_KEYS}
        return pods.run_args(self.pods["training job"], "trainer", node, "none",
                             command=["python", "-c", TRAINER, json.dumps({**cfg, "mode": mode})])

    def trainer(self, node):
        """A trainer's epoch: its JSON, or its error."""
        done = self.podman("run", "--rm", "--name", self.podman.name(f"{node.root.name}-trainer"),
                           *self.trainer_args(node, "epoch"), check=False)
        lines = done.stdout.strip().splitlines()
        assert lines, f"the trainer printed nothing ({done.returncode}):\n{done.stderr}"
        return json.loads(lines[-1])


def tar_samples(paths):
    """{key: {field: sha256}} of WebDataset shards, read here with tarfile."""
    out = {}
    for path in paths:
        with tarfile.open(path) as t:
            for m in t.getmembers():
                if m.isfile():
                    key, _, field = m.name.partition(".")
                    out.setdefault(key, {})[field] = hashlib.sha256(t.extractfile(m).read()).hexdigest()
    return out


def s3_server_binary():
    for profile in ("release", "debug"):
        path = REPO / "target" / profile / "examples" / "s3_server"
        if path.is_file():
            return path
    pytest.fail("the S3 test server is not built: cargo build --example s3_server", pytrace=False)


def answers(path):
    """Whether something listens on the Unix socket `path` (an error names
    why not)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(str(path))
        return True
    except OSError as e:
        return e
    finally:
        s.close()


@contextmanager
def timed(times, step):
    start = time.monotonic()
    yield
    times[step] = time.monotonic() - start


@pytest.fixture(scope="module")
def run():
    need(os.geteuid() == 0, "it runs podman and makes a network namespace as root")
    for tool in ("podman", "runc", "mmdebstrap", "ip"):
        need(shutil.which(tool), f"{tool} is not installed")
    program = REPO / "target" / "release" / "ringfeed"
    need(program.is_file(), "the release build is not there (cargo build --release)")
    work = Path(tempfile.mkdtemp(prefix="rf-images-", dir="/tmp"))
    podman = Podman(work)
    netns = f"rf-images-{os.getpid()}"
    server = None
    times, out = {}, {}
    try:
        # The base and the images.
        base_env = dict(podman.env)
        shm = shutil.disk_usage("/dev/shm") if os.path.isdir("/dev/shm") else None
        if shm and shm.free > 2 << 30:
            # mmdebstrap unpacks and installs in its temporary folder: in
            # memory, not on a disk the other builds share.
            base_env["TMPDIR"] = "/dev/shm"
        with timed(times, "base image (mmdebstrap)"):
            done = subprocess.run([REPO / "docker" / "debian-base.sh", BASE], capture_output=True, text=True,
                                  timeout=600, env=base_env)
            assert done.returncode == 0, done.stdout + done.stderr
        with timed(times, "images (wheel, podman build)"):
            done = subprocess.run([REPO / "docker" / "build-images.sh", "--base", BASE, "--pip-packages", ""],
                                  capture_output=True, text=True, timeout=900, env=podman.env, cwd=REPO)
            assert done.returncode == 0, done.stdout + done.stderr
        out["built"] = done.stdout.split()
        out["users"] = {name: podman("image", "inspect", "--format", "{{.Config.User}}", name).stdout.strip()
                        for name in out["built"]}
        out["sizes"] = {name: int(podman("image", "inspect", "--format", "{{.Size}}", name).stdout)
                        for name in [BASE, *out["built"]]}

        with timed(times, "containers"):
            # The S3 server in a network namespace of its own, with the
            # shards; the engine joins it.
            s3root = work / "s3"
            done = subprocess.run([program, "gen", s3root / BUCKET / "train", "--shards", str(SHARDS),
                                   "--shard-size", "2MiB"], check=True, capture_output=True, text=True,
                                  timeout=120)
            out["generated"] = done.stdout
            out["expected"] = tar_samples(sorted((s3root / BUCKET / "train").glob("shard-*.tar")))
            subprocess.run(["ip", "netns", "add", netns], check=True, capture_output=True, timeout=60)
            subprocess.run(["ip", "-n", netns, "link", "set", "lo", "up"], check=True, capture_output=True,
                           timeout=60)
            server = subprocess.Popen(["ip", "netns", "exec", netns, s3_server_binary(), s3root,
                                       "--bucket", BUCKET], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL)
            ready, _, _ = select.select([server.stdout], [], [], 60)
            endpoint = server.stdout.readline().decode().strip() if ready else ""
            assert endpoint.startswith("http://127.0.0.1:"), f"the S3 server did not start: {endpoint!r}"
            cluster = Cluster(podman, work, netns, endpoint)
            scenario(cluster, out)
            controls(cluster, out)
        out["times"] = times
        print("\ncontainer images: " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items())
              + "; sizes " + ", ".join(f"{k} {v / 1e6:.0f} MB" for k, v in out["sizes"].items()))
        yield out
    finally:
        if server is not None:
            server.stdin.close()
            server.wait(timeout=30)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=60)
        podman.clean()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(REPO / "target" / "images", ignore_errors=True)


def scenario(cluster, out):
    """The node as deployed: init containers, the engine, trainers, a
    SIGKILL, a restart, a stop."""
    podman = cluster.podman
    node = cluster.node("node")
    for c in cluster.pods["node engine"]["initContainers"]:
        cluster.init(node, c["name"])
    host_dirs = {p: node.host(p).stat() for p in ("/run/ringfeed", "/mnt/nvme/ringfeed-cache")}
    out["host dirs"] = {p: (s.st_uid, s.st_gid, oct(s.st_mode & 0o7777)) for p, s in host_dirs.items()}
    out["profile installed"] = node.host("/var/lib/kubelet/seccomp/ringfeed/ringfeed.json").read_bytes()
    engine = cluster.start_engine(node)
    out["first epoch"] = cluster.trainer(node)
    # The cache's entries, written in the background: every shard's.
    cache = node.host("/mnt/nvme/ringfeed-cache")
    deadline = time.monotonic() + 60
    while len(list(cache.glob("*.rfc"))) < SHARDS and time.monotonic() < deadline:
        time.sleep(0.1)
    out["cache entries"] = sorted((p.stat().st_uid, oct(p.stat().st_mode & 0o777)) for p in cache.glob("*.rfc"))
    # A trainer attached, the engine SIGKILLed under it.
    holder = subprocess.Popen(["podman", "--runtime", "runc", "run", "--rm", "--name",
                               podman.name("node-holder"), *cluster.trainer_args(node, "hold")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=podman.env)
    ready, _, _ = select.select([holder.stdout], [], [], 120)
    first = holder.stdout.readline() if ready else ""
    if first.strip() != "attached":
        holder.kill()
        raise AssertionError(f"the holding trainer did not attach: {first!r} {holder.communicate()}")
    podman("kill", "--signal", "KILL", engine)
    out["killed status"] = podman("wait", engine).stdout.strip()
    rest, err = holder.communicate(timeout=120)
    out["holder"] = (holder.returncode, rest, err)
    sock = node.host("/run/ringfeed/node.sock")
    out["left"] = (sock.is_socket(), answers(sock))
    # Started again, as the kubelet restarts it in its pod.
    podman("start", engine)
    out["restart log"] = podman.wait_log(engine, "ringfeed node: listening on /run/ringfeed/node.sock", count=2)
    out["second epoch"] = cluster.trainer(node)
    podman("stop", "--time", "60", engine, timeout=120)
    out["stopped"] = (podman("inspect", "--format", "{{.State.ExitCode}}", engine).stdout.strip(),
                      sock.exists(), podman.logs(engine))


def controls(cluster, out):
    """Each protection taken away, on a fresh node."""
    podman = cluster.podman
    # No init container gives the folders to the engine's user.
    node = cluster.node("no-own-dirs")
    cluster.init(node, "install-seccomp-profile")
    done = podman("run", "--rm", "--name", podman.name("no-own-dirs-engine"), *cluster.engine_args(node),
                  check=False)
    out["no own dirs"] = (done.returncode, done.stderr)
    # The socket's folder given, the cache left root's.
    node = cluster.node("root-cache")
    cluster.init(node, "install-seccomp-profile")
    os.chown(node.host_path({"path": "/run/ringfeed", "type": "DirectoryOrCreate"}), ENGINE_UID, ENGINE_UID)
    engine = cluster.start_engine(node)
    out["root cache"] = cluster.trainer(node)
    podman("stop", "--time", "60", engine, timeout=120)
    # The configuration as it was: lock_memory "on".
    node = cluster.node("lock-on", lock_memory="on")
    for c in cluster.pods["node engine"]["initContainers"]:
        cluster.init(node, c["name"])
    done = podman("run", "--rm", "--name", podman.name("lock-on-engine"), *cluster.engine_args(node),
                  check=False)
    out["lock on"] = (done.returncode, done.stderr)


def test_both_images_are_built_named_as_deployed_and_run_as_the_pods_user(run):
    # The images docker/Dockerfile builds (the registrar sidecar is Kubernetes' own).
    assert sorted(run["built"]) == sorted(v for k, v in images().items() if k.startswith("ringfeed-"))
    pod = pod_specs(documents())
    for image, user in run["users"].items():
        assert user == "10001:10001", (image, user)
    # The engine and the trainer run as the images' user; the CSI driver
    # runs the engine's image as root, each container saying so (it mounts
    # for the kubelet: mount(2) and /dev/fuse).
    for what in ("node engine", "training job"):
        sec = pod[what]["securityContext"]
        assert (sec["runAsUser"], sec["runAsGroup"]) == (10001, 10001), what
    csi = pod["csi driver"]
    for c in csi.get("initContainers", []) + csi["containers"]:
        assert security(csi, c).get("runAsUser") == 0, c["name"]
    driver = next(c for c in csi["containers"] if c["name"] == "driver")
    assert security(csi, driver).get("privileged") is True


def test_the_init_containers_give_the_engine_its_folders_and_its_profile(run):
    for path, owner in run["host dirs"].items():
        assert owner == (ENGINE_UID, ENGINE_UID, "0o700"), (path, owner)
    assert run["profile installed"] == (REPO / "deploy" / "seccomp" / "ringfeed.json").read_bytes()


def test_the_trainer_gets_every_byte_of_the_epoch_through_the_engine_on_io_uring(run):
    first = run["first epoch"]
    assert "error" not in first, first
    assert f"wrote {SHARDS} shards, {len(run['expected'])} samples" in run["generated"]
    assert first["samples"] == run["expected"]
    stats = first["stats"]
    assert stats["io_backend"] == "io_uring", stats["notes"]
    assert stats["node"]["socket"] == "/run/ringfeed/node.sock"
    assert stats["cache_misses"] == SHARDS, stats
    # The arena's NUMA binding is refused under the profile, and said.
    assert any("mbind" in n for n in stats["notes"]), stats["notes"]
    assert run["cache entries"] == [(ENGINE_UID, "0o600")] * SHARDS


def test_a_killed_engine_fails_its_trainer_by_name_and_serves_again_once_restarted(run):
    assert run["killed status"] == "137"
    code, rest, err = run["holder"]
    assert code == 3, (code, rest, err)
    result = json.loads(rest.strip().splitlines()[-1])
    assert result["error"] == "NodeError", result
    assert "exited or closed the connection" in result["message"], result
    assert result["batches"] >= 1
    is_socket, answer = run["left"]
    assert is_socket, "the killed engine's socket is gone"
    assert isinstance(answer, ConnectionRefusedError), answer
    assert "ringfeed node: replaced the stale socket /run/ringfeed/node.sock" in run["restart log"]
    second = run["second epoch"]
    assert "error" not in second, second
    assert second["samples"] == run["expected"]
    assert second["stats"]["cache_hits"] == SHARDS, second["stats"]


def test_sigterm_stops_the_engine_with_its_socket_removed(run):
    code, left, logs = run["stopped"]
    assert code == "0", logs
    assert not left
    assert "ringfeed node: signal 15: removed the socket; exiting" in logs


def test_without_its_folders_the_engine_names_why(run):
    code, err = run["no own dirs"]
    assert code != 0
    assert ("the folder `/run/ringfeed` (user 0, mode 755) may not be written by this user "
            f"({ENGINE_UID})") in err, err
    result = run["root cache"]
    assert result.get("error") == "ConfigError", result
    assert (f"cache directory `/cache`: it belongs to uid 0, not to this user (uid {ENGINE_UID})"
            in result["message"]), result
    code, err = run["lock on"]
    assert code != 0
    assert "mlock of 268435456 bytes failed" in err and '`lock_memory` is "on"' in err, err
