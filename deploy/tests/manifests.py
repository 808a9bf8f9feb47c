"""deploy/ as the tests read it: the resources kustomization.yaml lists,
the images it names, and what docker/Dockerfile says its images run as."""

import re
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[1]
REPO = DEPLOY.parent


def kustomization():
    return yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())


def resources():
    return kustomization()["resources"]


def documents():
    """{(kind, name): manifest} of every resource kustomization.yaml lists."""
    out = {}
    for f in resources():
        for d in yaml.safe_load_all((DEPLOY / f).read_text()):
            out[(d["kind"], d["metadata"]["name"])] = d
    return out


def images(k=None):
    """{name in the manifests: the image it becomes}, from the
    kustomization's `images:` (its `newName` and `newTag`)."""
    k = kustomization() if k is None else k
    return {i["name"]: f"{i.get('newName', i['name'])}:{i['newTag']}" for i in k.get("images", [])}


def release_version():
    """The version in Cargo.toml: the images' tag."""
    text = (REPO / "Cargo.toml").read_text()
    return re.search(r'^version\s*=\s*"([^"]+)"', text, re.M).group(1)


def dockerfile_users(text=None):
    """{stage: its last USER} of docker/Dockerfile (a stage inherits its
    base stage's)."""
    text = (REPO / "docker" / "Dockerfile").read_text() if text is None else text
    users, stage = {}, None
    for line in text.splitlines():
        m = re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?\s*$", line, re.I)
        if m:
            base, stage = m.group(1), m.group(2)
            if base in users:
                users[stage] = users[base]
            continue
        m = re.match(r"USER\s+(\S+)\s*$", line, re.I)
        if m and stage:
            users[stage] = m.group(1)
    return users


def pod_specs(docs):
    """{what: the pod spec} of the node engine's DaemonSet, the CSI
    driver's and the Job."""
    return {
        "node engine": docs[("DaemonSet", "ringfeed-node")]["spec"]["template"]["spec"],
        "csi driver": docs[("DaemonSet", "ringfeed-csi")]["spec"]["template"]["spec"],
        "training job": docs[("Job", "ringfeed-train")]["spec"]["template"]["spec"],
    }


def security(pod, container):
    """A container's security context with its pod's filled in, as the
    kubelet applies them (the container's own fields win)."""
    out = {k: v for k, v in pod.get("securityContext", {}).items()
           if k in ("runAsUser", "runAsGroup", "runAsNonRoot", "seccompProfile")}
    out.update(container.get("securityContext", {}))
    return out
