"""Pod Security: each pod's level computed from the manifests
(pod_security.py, the checks of the built-in admission's `baseline` and
`restricted`), admitted by the level the namespace enforces, and the same
as docs/deployment.md's table says; the training pod without the node
engine's socket meets `restricted`. Controls: a pod sharing the host's
pids is not `baseline`; one without a seccomp profile is not
`restricted`; a namespace enforcing `baseline` does not admit the pods."""

import copy
import re

from manifests import REPO, documents, pod_specs
from pod_security import allows, baseline_problems, level, restricted_problems


def documented_levels():
    """{pod: level} from docs/deployment.md's "Pod Security" table."""
    text = (REPO / "docs" / "deployment.md").read_text()
    section = text.split("## Pod Security", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| ([a-zA-Z ]+) \| (privileged|baseline|restricted) \|", section, re.M)
    return dict(rows)


def test_each_pod_runs_at_the_level_the_docs_state_and_the_namespace_admits():
    docs = documents()
    pods = pod_specs(docs)
    ns = docs[("Namespace", "ringfeed")]["metadata"]["labels"]
    enforced = ns["pod-security.kubernetes.io/enforce"]
    got = {}
    for what, pod in pods.items():
        got[what.replace("csi", "CSI")] = level(pod)
        print(f"{what}: {level(pod)}; baseline: {baseline_problems(pod) or 'met'}")
        assert allows(enforced, level(pod)), f"{what} ({level(pod)}) is not admitted under {enforced}"
    assert got == documented_levels()
    # The trainer's one reason: the engine's socket. Without it, restricted.
    job = copy.deepcopy(pods["training job"])
    socket = [v["name"] for v in job["volumes"] if "hostPath" in v]
    assert socket == ["socket"], socket
    job["volumes"] = [v for v in job["volumes"] if v["name"] != "socket"]
    for c in job["containers"]:
        c["volumeMounts"] = [m for m in c["volumeMounts"] if m["name"] != "socket"]
    assert restricted_problems(job) == []
    assert level(job) == "restricted"
    # Controls.
    bad = copy.deepcopy(job)
    bad["hostPID"] = True
    assert level(bad) == "privileged" and "hostPID" in baseline_problems(bad)
    bad = copy.deepcopy(job)
    bad["containers"][0]["securityContext"].pop("seccompProfile")
    assert level(bad) == "baseline"
    assert "trainer: no RuntimeDefault or Localhost seccomp profile" in restricted_problems(bad)
    assert not allows("baseline", level(pods["csi driver"]))
