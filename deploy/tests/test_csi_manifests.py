"""deploy/'s CSI driver and volumes as the kubelet and the driver read them.

- The CSIDriver object names the driver the volumes name; nothing to
  attach, PersistentVolumes only (the driver refuses inline volumes), no
  fsGroup chown through an object store.
- The driver's DaemonSet: `ringfeed csi` privileged and root (mount(2)),
  its socket in the kubelet's plugin folder for the driver's name, the
  registrar sidecar registering that socket's host path in the kubelet's
  registration folder, the kubelet's folder mounted with Bidirectional
  propagation (the mounts reach the pods), the node's name from the
  downward API, its records on a hostPath, the node engine's cache on the
  engine's hostPath and given to the engine's user by an init container,
  updated on delete only (a rolling update would cut every mount of the
  node).
- The node engine, the driver and the training job select the same nodes,
  by a label the cluster's owner sets (not the GPU Operator's).
- Each claim binds its volume by name (no StorageClass); the job writes
  its checkpoints (`--ckpt-dir`) to a write-once volume of the trainers'
  user, not to an emptyDir, and mounts the dataset's claim read-only.
- Every PersistentVolume is accepted by the driver itself (`ringfeed csi
  --check-volume`, the publish's own checks), and a volume with a mount
  option off the allow-list or an unknown attribute is refused by name
  (the controls).
Each check fails on a copy with that one setting broken (the controls).
"""

import copy
import json
import re
import subprocess

from manifests import documents, pod_specs, security
from test_deploy import ringfeed_program

DRIVER = ("DaemonSet", "ringfeed-csi")
KUBELET = "/var/lib/kubelet"


def flag(args, name):
    for a in args:
        m = re.fullmatch(rf"--{name}=(.*)", a)
        if m:
            return m.group(1)
    return None


def host_path(pod, container, path):
    """The hostPath mounted at `path` (or the folder holding it) in `container`."""
    vols = {v["name"]: v for v in pod["volumes"]}
    best = None
    for m in container.get("volumeMounts", []):
        if (path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")) and \
                (best is None or len(m["mountPath"]) > len(best[0]["mountPath"])):
            best = (m, vols[m["name"]])
    if not best or "hostPath" not in best[1]:
        return None
    m, v = best
    return v["hostPath"]["path"] + path[len(m["mountPath"]):]


def csi_problems(docs):
    out = []
    pvs = {n: d for (k, n), d in docs.items() if k == "PersistentVolume"}
    drivers = {d["spec"]["csi"]["driver"] for d in pvs.values()}
    [(_, name)] = [key for key in docs if key[0] == "CSIDriver"]
    spec = docs[("CSIDriver", name)]["spec"]
    if drivers != {name}:
        out.append(f"the volumes name {sorted(drivers)}, the CSIDriver object {name}")
    if spec.get("attachRequired") is not False:
        out.append("attachRequired is not false: the kubelet would wait for an attach no one makes")
    if spec.get("volumeLifecycleModes") != ["Persistent"]:
        out.append("volumeLifecycleModes is not [Persistent]: the driver refuses inline volumes")
    if spec.get("fsGroupPolicy") != "None":
        out.append("fsGroupPolicy is not None: the kubelet would chown the volume for fsGroup")

    ds = docs[DRIVER]
    pod = ds["spec"]["template"]["spec"]
    by_name = {c["name"]: c for c in pod["containers"]}
    driver, registrar = by_name.get("driver"), by_name.get("registrar")
    args = driver["command"]
    if args[:2] != ["ringfeed", "csi"]:
        out.append(f"the driver container runs {args[:2]}, not `ringfeed csi`")
    sc = security(pod, driver)
    if sc.get("privileged") is not True or sc.get("runAsUser") != 0:
        out.append("the driver is not a privileged root container: it cannot mount")
    endpoint = flag(args, "endpoint") or ""
    socket = endpoint.removeprefix("unix://")
    plugin_dir = f"{KUBELET}/plugins/{name}"
    if host_path(pod, driver, socket) != f"{plugin_dir}/csi.sock":
        out.append(f"the driver's socket {socket} is not {plugin_dir}/csi.sock on the host")
    rargs = registrar["args"] if registrar else []
    if flag(rargs, "csi-address") != socket or host_path(pod, registrar, socket) != f"{plugin_dir}/csi.sock":
        out.append("the registrar does not reach the driver's socket")
    if flag(rargs, "kubelet-registration-path") != f"{plugin_dir}/csi.sock":
        out.append("the registrar registers another path than the driver's socket on the host")
    if host_path(pod, registrar, "/registration") != f"{KUBELET}/plugins_registry":
        out.append("the registrar's /registration is not the kubelet's plugins_registry")
    bidi = [m for m in driver["volumeMounts"] if m.get("mountPropagation") == "Bidirectional"
            and host_path(pod, driver, m["mountPath"]) == KUBELET]
    if not bidi:
        out.append(f"{KUBELET} is not mounted with Bidirectional propagation: the mounts would not reach the pods")
    env = {e["name"]: e for e in driver.get("env", [])}
    if flag(args, "node-id") != "$(NODE_NAME)" or \
            env.get("NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "spec.nodeName":
        out.append("--node-id is not the node's name (spec.nodeName)")
    state = flag(args, "state-dir")
    if not state or not host_path(pod, driver, state):
        out.append("--state-dir is not on a hostPath: a restarted driver would not find its mounts")
    engine_pod = pod_specs(docs)["node engine"]
    (engine,) = engine_pod["containers"]
    cfg = json.loads(docs[("ConfigMap", "ringfeed-node")]["data"]["engine.json"])
    engine_cache = host_path(engine_pod, engine, cfg["cache_dir"])
    cache = flag(args, "cache-dir")
    if not cache or host_path(pod, driver, cache) != engine_cache:
        out.append(f"--cache-dir is not the node engine's cache ({engine_cache})")
    engine_user = f"{security(engine_pod, engine).get('runAsUser')}:{security(engine_pod, engine).get('runAsGroup')}"
    given = False
    for init in pod.get("initContainers", []):
        m = re.search(r"chown (\d+:\d+) (\S+)", " ".join(init.get("command", [])))
        isc = security(pod, init)
        if m and m.group(1) == engine_user and isc.get("runAsUser") == 0 and \
                "CHOWN" in isc.get("capabilities", {}).get("add", []) and \
                host_path(pod, init, m.group(2)) == engine_cache:
            given = True
    if not given:
        out.append(f"no init container gives the cache to the engine's user {engine_user}")
    if ds["spec"].get("updateStrategy", {}).get("type") != "OnDelete":
        out.append("the driver is updated by rolling: each update would cut the node's mounts")
    return out


def selector_problems(docs):
    pods = pod_specs(docs)
    selectors = {what: p.get("nodeSelector") for what, p in pods.items()}
    out = []
    if len({json.dumps(s, sort_keys=True) for s in selectors.values()}) != 1:
        out.append(f"the pods select different nodes: {selectors}")
    for what, s in selectors.items():
        if not s:
            out.append(f"the {what} selects no nodes")
        elif "nvidia.com/gpu.present" in s:
            out.append(f"the {what} selects nvidia.com/gpu.present, a label only NVIDIA's GPU Operator sets")
    return out


def volume_problems(docs):
    out = []
    pvs = {n: d for (k, n), d in docs.items() if k == "PersistentVolume"}
    pvcs = {n: d for (k, n), d in docs.items() if k == "PersistentVolumeClaim"}
    for name, pvc in pvcs.items():
        pv = pvs.get(pvc["spec"].get("volumeName"))
        if pv is None:
            out.append(f"claim {name} binds no volume of deploy/")
            continue
        if pvc["spec"].get("storageClassName") != "" or pv["spec"].get("storageClassName") != "":
            out.append(f"claim {name}: storageClassName is not \"\" (a default class would provision)")
        if pvc["spec"]["accessModes"] != pv["spec"]["accessModes"]:
            out.append(f"claim {name} asks {pvc['spec']['accessModes']}, its volume has {pv['spec']['accessModes']}")
        ref = pv["spec"].get("claimRef", {})
        if ref and ref.get("name") != name:
            out.append(f"volume {pv['metadata']['name']} is reserved for {ref.get('name')}, not {name}")
    job = pod_specs(docs)["training job"]
    (trainer,) = job["containers"]
    command = " ".join(trainer["command"])
    ckpt = re.search(r"--ckpt-dir[= ](\S+)", command)
    mounts = {m["mountPath"]: m for m in trainer["volumeMounts"]}
    vols = {v["name"]: v for v in job["volumes"]}
    if not ckpt or ckpt.group(1) not in mounts:
        out.append("the trainers save checkpoints to no mounted volume (--ckpt-dir)")
    else:
        vol = vols[mounts[ckpt.group(1)]["name"]]
        claim = vol.get("persistentVolumeClaim", {}).get("claimName")
        pv = pvs.get(pvcs.get(claim, {}).get("spec", {}).get("volumeName"))
        if pv is None:
            out.append(f"checkpoints go to {sorted(set(vol) - {'name'})}, not to a claim of the object store")
        else:
            attrs = pv["spec"]["csi"].get("volumeAttributes", {})
            if attrs.get("access") == "read-only" or mounts[ckpt.group(1)].get("readOnly"):
                out.append("the checkpoints' volume is read-only")
            user = security(job, trainer).get("runAsUser")
            if attrs.get("uid") != str(user):
                out.append(f"the checkpoints' volume belongs to uid {attrs.get('uid')}, the trainers run as {user}")
    data = [m for m in trainer["volumeMounts"]
            if vols[m["name"]].get("persistentVolumeClaim", {}).get("claimName") == "train-data"]
    if not data or not data[0].get("readOnly"):
        out.append("the dataset's claim is not mounted read-only")
    return out


def check_volume(pv):
    done = subprocess.run([ringfeed_program(), "csi", "--check-volume", "-", "--cache-dir", "/cache"],
                          input=json.dumps(pv), capture_output=True, text=True, timeout=60)
    return done.returncode, (done.stdout + done.stderr).strip()


def test_the_csi_driver_runs_as_the_kubelet_needs_it():
    docs = documents()
    assert csi_problems(docs) == []

    def broken(change):
        d = copy.deepcopy(docs)
        change(d)
        return csi_problems(d)

    def pod(d):
        return d[DRIVER]["spec"]["template"]["spec"]

    def container(d, name):
        return next(c for c in pod(d)["containers"] if c["name"] == name)

    def replace_arg(d, name, old, new):
        c = container(d, name)
        key = "command" if "command" in c else "args"
        c[key] = [a.replace(old, new) for a in c[key]]

    cases = {
        "attachRequired is not false": lambda d: d[("CSIDriver", "csi.ringfeed.dev")]["spec"].update(attachRequired=True),
        "volumeLifecycleModes is not [Persistent]": lambda d: d[("CSIDriver", "csi.ringfeed.dev")]["spec"].update(
            volumeLifecycleModes=["Persistent", "Ephemeral"]),
        "the driver is not a privileged root container": lambda d: container(d, "driver")["securityContext"].update(
            privileged=False),
        "the registrar registers another path": lambda d: replace_arg(
            d, "registrar", "plugins/csi.ringfeed.dev/csi.sock", "plugins/other/csi.sock"),
        "the registrar does not reach the driver's socket": lambda d: replace_arg(
            d, "registrar", "--csi-address=/csi/csi.sock", "--csi-address=/csi/other.sock"),
        "is not mounted with Bidirectional propagation": lambda d: [
            m.pop("mountPropagation") for m in container(d, "driver")["volumeMounts"] if "mountPropagation" in m],
        "--node-id is not the node's name": lambda d: replace_arg(d, "driver", "$(NODE_NAME)", "node-1"),
        "--cache-dir is not the node engine's cache": lambda d: [
            v["hostPath"].update(path="/mnt/other") for v in pod(d)["volumes"] if v["name"] == "cache"],
        "no init container gives the cache to the engine's user": lambda d: pod(d).update(initContainers=[]),
        "the driver is updated by rolling": lambda d: d[DRIVER]["spec"].update(
            updateStrategy={"type": "RollingUpdate"}),
        "--state-dir is not on a hostPath": lambda d: replace_arg(
            d, "driver", "--state-dir=/run/ringfeed/csi", "--state-dir=/tmp/csi"),
    }
    for want, change in cases.items():
        got = broken(change)
        assert any(want in g for g in got), f"{want!r} not in {got}"


def test_the_nodes_are_selected_alike_by_a_label_the_owner_sets():
    docs = documents()
    assert selector_problems(docs) == []
    d = copy.deepcopy(docs)
    pod_specs(d)["node engine"]["nodeSelector"] = {"nvidia.com/gpu.present": "true"}
    got = selector_problems(d)
    assert any("select different nodes" in g for g in got), got
    assert any("a label only NVIDIA's GPU Operator sets" in g for g in got), got


def test_the_job_saves_checkpoints_to_a_write_once_volume_of_its_user():
    docs = documents()
    assert volume_problems(docs) == []
    job = ("Job", "ringfeed-train")

    def broken(change):
        d = copy.deepcopy(docs)
        change(d)
        return volume_problems(d)

    def jpod(d):
        return d[job]["spec"]["template"]["spec"]

    got = broken(lambda d: [v.update(emptyDir={}) or v.pop("persistentVolumeClaim")
                            for v in jpod(d)["volumes"] if v["name"] == "checkpoints"])
    assert any("not to a claim of the object store" in g for g in got), got
    got = broken(lambda d: d[("PersistentVolume", "ringfeed-checkpoints")]["spec"]["csi"]["volumeAttributes"].update(
        uid="0"))
    assert any("the checkpoints' volume belongs to uid 0" in g for g in got), got
    got = broken(lambda d: d[("PersistentVolume", "ringfeed-checkpoints")]["spec"]["csi"]["volumeAttributes"].update(
        access="read-only"))
    assert "the checkpoints' volume is read-only" in got
    got = broken(lambda d: d[("PersistentVolumeClaim", "checkpoints")]["spec"].update(volumeName="elsewhere"))
    assert "claim checkpoints binds no volume of deploy/" in got
    got = broken(lambda d: d[("PersistentVolumeClaim", "train-data")]["spec"].update(storageClassName="gp3"))
    assert any("claim train-data: storageClassName" in g for g in got), got


def test_every_volume_is_one_the_driver_accepts():
    docs = documents()
    pvs = [d for (k, _), d in docs.items() if k == "PersistentVolume"]
    assert len(pvs) == 2
    for pv in pvs:
        code, text = check_volume(pv)
        print(text)
        assert code == 0, text
        name = pv["metadata"]["name"]
        assert text.startswith(f"PersistentVolume `{name}`: accepted"), text
        assert pv["spec"]["csi"]["volumeAttributes"]["source"] in text
    read_only, write_once = sorted(pvs, key=lambda p: p["spec"]["accessModes"] != ["ReadOnlyMany"])
    assert "accepted (read-only)" in check_volume(read_only)[1]
    assert "accepted (write-once)" in check_volume(write_once)[1]
    # Controls: an option off the allow-list, an unknown attribute, another
    # driver's volume.
    bad = copy.deepcopy(read_only)
    bad["spec"]["mountOptions"].append("cache-dir=/elsewhere")
    code, text = check_volume(bad)
    assert code != 0 and "refused (InvalidArgument): mount option `cache-dir` is not allowed" in text, text
    bad = copy.deepcopy(read_only)
    bad["spec"]["csi"]["volumeAttributes"]["bucketName"] = "x"
    code, text = check_volume(bad)
    assert code != 0 and "bucketName" in text and "InvalidArgument" in text, text
    bad = copy.deepcopy(read_only)
    bad["spec"]["csi"]["driver"] = "s3.csi.aws.com"
    code, text = check_volume(bad)
    assert code != 0 and "is `s3.csi.aws.com`, not `csi.ringfeed.dev`" in text, text
