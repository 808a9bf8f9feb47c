"""The containers of deploy/'s pods as podman runs them here: what a
kubelet (with containerd and runc, as on EKS) makes of a container of a
manifest, for the image test (test_images.py).

Read from the manifests, never restated: the image (through
kustomization.yaml's `images:`), the command, the environment, the user
and group, `runAsNonRoot` (refused as the kubelet refuses it), no new
privileges, the read-only root file system, the capabilities, the seccomp
profile (`Localhost`: the file under the node's kubelet root, where the
init container put it), and the volumes: a hostPath under the test's node
folder, made as the kubelet makes one (`DirectoryOrCreate`: root's, mode
0755; `Directory`: must be there), a ConfigMap's keys as files, an
emptyDir as a folder of mode 0777 (`medium: Memory`: a tmpfs), and a
PersistentVolumeClaim as a folder of the claim's own (the CSI driver's
mount that serves a claim on a node is run and tested as the kubelet
drives it in cli/tests/csi.rs; here the trainer's claims are only
mounted, and the image test's trainer writes nothing there).

What a pod gets from Kubernetes that podman would give otherwise:
- An added capability reaches a container of another user than root only
  in its bounding set, never its effective set (the CRI sets no ambient
  capabilities; podman does): such a container is run with none.
- RLIMIT_MEMLOCK is the runtime's, which a pod cannot raise: Linux's
  default since 5.16, 8 MiB, which containerd passes on (a node of an
  older kernel gives 64 KiB: docs/deployment.md).

Not emulated, and why (anything else a manifest adds fails the test, so
the manifests and this file stay in step): `resources` (cgroup limits and
huge pages: the test's engine has a small budget in normal pages),
`ports` and probes (nothing scrapes here), the service account (the engine
gets the S3 server's keys in its environment), scheduling (one node).
"""

import os
import resource
from pathlib import Path

from manifests import images, security

CONTAINER_KEYS = {"name", "image", "command", "args", "env", "securityContext", "volumeMounts"}
NOT_EMULATED = {"resources", "ports", "readinessProbe"}
SECURITY_KEYS = {"runAsUser", "runAsGroup", "runAsNonRoot", "allowPrivilegeEscalation",
                 "readOnlyRootFilesystem", "capabilities", "seccompProfile"}
POD_KEYS = {"serviceAccountName", "nodeSelector", "tolerations", "securityContext", "initContainers",
            "containers", "volumes", "subdomain", "restartPolicy"}
# The kubelet's root: Localhost seccomp profiles are read from its
# seccomp/ folder.
KUBELET_ROOT = "/var/lib/kubelet"
# RLIMIT_MEMLOCK in a pod: Linux's default since 5.16 (MLOCK_LIMIT).
POD_MEMLOCK = 8 << 20


class Unsupported(Exception):
    """A manifest uses what this emulation does not know."""


class Node:
    """One node's host folders under `root`, and the ConfigMaps its pods
    mount (`configmaps`: {name: {key: text}})."""

    def __init__(self, root, configmaps):
        self.root = Path(root)
        self.configmaps = configmaps

    def host(self, path):
        return self.root / path.lstrip("/")

    def host_path(self, source):
        """The folder of a hostPath volume, made as the kubelet makes it."""
        path = self.host(source["path"])
        kind = source.get("type", "")
        if kind == "DirectoryOrCreate":
            if not path.exists():
                path.mkdir(parents=True)
                os.chown(path, 0, 0)
                os.chmod(path, 0o755)
        elif kind == "Directory":
            if not path.is_dir():
                raise Unsupported(f"hostPath {source['path']} (type Directory) is not there: the pod would not start")
        else:
            raise Unsupported(f"hostPath type {kind!r}")
        return path

    def claim(self, name):
        """The folder standing for claim `name` on this node."""
        path = self.root / "claims" / name
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, 0o777)
        return path

    def configmap(self, name):
        folder = self.root / "configmaps" / name
        folder.mkdir(parents=True, exist_ok=True)
        for key, text in self.configmaps[name].items():
            (folder / key).write_text(text)
            os.chmod(folder / key, 0o644)
        return folder


def limits():
    """The limits every container gets: on open files and processes, what
    the runtime itself has (run as root without CAP_SYS_RESOURCE, as on
    this test's machines, podman cannot raise them to its defaults, and a
    container may not exceed them: its own hard limit on files, and on
    processes the system's pid_max, to which podman sets its own); on
    locked memory, a pod's."""
    files = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    procs = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], int(Path("/proc/sys/kernel/pid_max").read_text()))
    return [f"--ulimit=nofile={files}:{files}", f"--ulimit=nproc={procs}:{procs}",
            f"--ulimit=memlock={POD_MEMLOCK}:{POD_MEMLOCK}"]


def run_args(pod, container, node, network, command=None, env=None):
    """`podman run` arguments (after `run`, before none) for `container`
    (a name) of `pod` (a pod spec) on `node`, on `network` (podman's
    `--network` value), with `command` instead of the manifest's where
    given, and `env` added to its environment."""
    unknown = set(pod) - POD_KEYS
    if unknown:
        raise Unsupported(f"pod fields {sorted(unknown)}")
    c = next(c for c in pod.get("initContainers", []) + pod["containers"] if c["name"] == container)
    unknown = set(c) - CONTAINER_KEYS - NOT_EMULATED
    if unknown:
        raise Unsupported(f"container {container}: fields {sorted(unknown)}")
    sc = security(pod, c)
    unknown = set(sc) - SECURITY_KEYS
    if unknown:
        raise Unsupported(f"container {container}: securityContext {sorted(unknown)}")
    uid, gid = sc.get("runAsUser"), sc.get("runAsGroup")
    if uid is None or gid is None:
        raise Unsupported(f"container {container}: no runAsUser and runAsGroup (the image's user is not read)")
    if sc.get("runAsNonRoot") and uid == 0:
        raise Unsupported(f"container {container}: runAsNonRoot with runAsUser 0 (the kubelet refuses it)")
    args = [*limits(), f"--network={network}", f"--user={uid}:{gid}"]
    if sc.get("allowPrivilegeEscalation") is False:
        args.append("--security-opt=no-new-privileges")
    if sc.get("readOnlyRootFilesystem"):
        # Kubernetes mounts no tmpfs of its own on /tmp or /run.
        args += ["--read-only", "--read-only-tmpfs=false"]
    caps = sc.get("capabilities", {})
    for cap in caps.get("drop", []):
        args.append(f"--cap-drop={cap.lower()}")
    if uid == 0:
        args += [f"--cap-add={cap}" for cap in caps.get("add", [])]
    profile = sc.get("seccompProfile", {"type": "Unconfined"})
    if profile["type"] == "Localhost":
        path = node.host(KUBELET_ROOT) / "seccomp" / profile["localhostProfile"]
        if not path.is_file():
            raise Unsupported(f"container {container}: seccomp profile {path} is not installed")
        args.append(f"--security-opt=seccomp={path}")
    elif profile["type"] == "Unconfined":
        args.append("--security-opt=seccomp=unconfined")
    elif profile["type"] != "RuntimeDefault":
        raise Unsupported(f"seccompProfile {profile['type']}")
    for e in c.get("env", []):
        args.append(f"--env={e['name']}={e['value']}")
    for name, value in (env or {}).items():
        args.append(f"--env={name}={value}")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for m in c.get("volumeMounts", []):
        args += mount(volumes[m["name"]], m, node)
    image = images()[c["image"]]
    if command is None:
        command = c.get("command", []) + c.get("args", [])
        if not c.get("command"):
            raise Unsupported(f"container {container}: no command (the image's entry point is not read)")
    return [*args, f"--entrypoint={command[0]}", image, *command[1:]]


def mount(volume, m, node):
    """The podman option mounting `volume` as the volumeMount `m` says."""
    unknown = set(m) - {"name", "mountPath", "subPath", "readOnly"}
    if unknown:
        raise Unsupported(f"volumeMount {m['name']}: {sorted(unknown)}")
    if "hostPath" in volume:
        source = node.host_path(volume["hostPath"])
    elif "configMap" in volume:
        source = node.configmap(volume["configMap"]["name"])
    elif "persistentVolumeClaim" in volume:
        source = node.claim(volume["persistentVolumeClaim"]["claimName"])
    elif "emptyDir" in volume:
        medium = volume["emptyDir"].get("medium", "")
        if medium == "Memory":
            size = volume["emptyDir"].get("sizeLimit", "64Mi").replace("Gi", "g").replace("Mi", "m")
            return [f"--mount=type=tmpfs,destination={m['mountPath']},tmpfs-size={size}"]
        # HugePages-2Mi as a plain folder: the engine makes its arena with
        # memfd_create and never reads the mount, and the test's engine
        # asks for no huge pages.
        if medium not in ("", "HugePages-2Mi"):
            raise Unsupported(f"emptyDir medium {medium}")
        source = node.root / "emptydirs" / volume["name"]
        source.mkdir(parents=True, exist_ok=True)
        os.chmod(source, 0o777)
    else:
        raise Unsupported(f"volume {volume['name']}: {sorted(volume)}")
    if "subPath" in m:
        source = source / m["subPath"]
    mode = "ro" if m.get("readOnly") else "rw"
    return [f"--volume={source}:{m['mountPath']}:{mode}"]
