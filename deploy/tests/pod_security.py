"""The Pod Security Standards' levels (Kubernetes' built-in Pod Security
admission) computed from a pod spec: the checks of `baseline` and
`restricted` this project's pods could fail, each named. Pure: no cluster.

- baseline: no host namespaces, no privileged container, capabilities
  added only from the baseline's list, no hostPath volume, no host port,
  no Unconfined seccomp profile.
- restricted: baseline, and only the volume types it allows,
  allowPrivilegeEscalation false, runAsNonRoot true and no runAsUser 0,
  a seccomp profile RuntimeDefault or Localhost, capabilities drop ALL and
  add at most NET_BIND_SERVICE.
"""

BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                 "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}
LEVELS = ["restricted", "baseline", "privileged"]


def containers(pod):
    return pod.get("initContainers", []) + pod.get("containers", [])


def baseline_problems(pod):
    out = []
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(host):
            out.append(f"{host}")
    for v in pod.get("volumes", []):
        if "hostPath" in v:
            out.append(f"hostPath volume {v['name']}")
    psc = pod.get("securityContext", {})
    if psc.get("seccompProfile", {}).get("type") == "Unconfined":
        out.append("pod seccomp Unconfined")
    for c in containers(pod):
        sc = c.get("securityContext", {})
        if sc.get("privileged"):
            out.append(f"{c['name']}: privileged")
        extra = set(sc.get("capabilities", {}).get("add", [])) - BASELINE_CAPS
        if extra:
            out.append(f"{c['name']}: adds {sorted(extra)}")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            out.append(f"{c['name']}: hostPort")
        if sc.get("seccompProfile", {}).get("type") == "Unconfined":
            out.append(f"{c['name']}: seccomp Unconfined")
    return out


def restricted_problems(pod):
    out = baseline_problems(pod)
    for v in pod.get("volumes", []):
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {v['name']} of type {sorted(kinds - RESTRICTED_VOLUMES)}")
    psc = pod.get("securityContext", {})
    for c in containers(pod):
        sc = c.get("securityContext", {})
        name = c["name"]
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation is not false")
        if sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is not True:
            out.append(f"{name}: runAsNonRoot is not true")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            out.append(f"{name}: runAsUser 0")
        seccomp = sc.get("seccompProfile", psc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: no RuntimeDefault or Localhost seccomp profile")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            out.append(f"{name}: capabilities not dropped (ALL)")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: adds {sorted(set(caps['add']) - {'NET_BIND_SERVICE'})}")
    return out


def level(pod):
    """The strictest level `pod` meets."""
    if not restricted_problems(pod):
        return "restricted"
    if not baseline_problems(pod):
        return "baseline"
    return "privileged"


def allows(namespace_level, pod_level):
    return LEVELS.index(pod_level) <= LEVELS.index(namespace_level)
