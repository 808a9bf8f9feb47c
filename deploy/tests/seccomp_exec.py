"""Runs a program under a seccomp profile of the JSON format the kubelet
and the container runtimes read (`deploy/seccomp/ringfeed.json`), as a
container under `seccompProfile: Localhost` would: the profile becomes a
libseccomp filter for this process, then the program is executed in its
place (the filter is inherited).

    /usr/bin/python3 seccomp_exec.py PROFILE.json -- PROGRAM ARGS...

Needs the libseccomp bindings (Debian: python3-seccomp), so it runs under
the system's Python. Understands what the project's profile uses: the
default action (errno), per-call actions (allow, errno), argument
conditions (the comparisons libseccomp has), architectures.
"""

import json
import os
import sys

import seccomp

OPS = {
    "SCMP_CMP_EQ": seccomp.EQ,
    "SCMP_CMP_NE": seccomp.NE,
    "SCMP_CMP_LT": seccomp.LT,
    "SCMP_CMP_LE": seccomp.LE,
    "SCMP_CMP_GT": seccomp.GT,
    "SCMP_CMP_GE": seccomp.GE,
    "SCMP_CMP_MASKED_EQ": seccomp.MASKED_EQ,
}


def action(name, errno):
    if name == "SCMP_ACT_ALLOW":
        return seccomp.ALLOW
    if name == "SCMP_ACT_ERRNO":
        return seccomp.ERRNO(errno)
    if name in ("SCMP_ACT_KILL", "SCMP_ACT_KILL_PROCESS"):
        return seccomp.KILL_PROCESS
    raise SystemExit(f"seccomp_exec: action {name} is not supported")


def load(profile):
    f = seccomp.SyscallFilter(defaction=action(profile["defaultAction"], profile.get("defaultErrnoRet", 1)))
    for rule in profile["syscalls"]:
        act = action(rule["action"], rule.get("errnoRet", 1))
        for name in rule["names"]:
            try:
                seccomp.resolve_syscall(seccomp.Arch.NATIVE, name)
            except ValueError:
                continue  # not a call of this architecture
            args = []
            for a in rule.get("args", []):
                op = OPS[a["op"]]
                if op == seccomp.MASKED_EQ:
                    args.append(seccomp.Arg(a["index"], op, a["value"], a.get("valueTwo", 0)))
                else:
                    args.append(seccomp.Arg(a["index"], op, a["value"]))
            f.add_rule(act, name, *args)
    f.load()


def main():
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        raise SystemExit("usage: seccomp_exec.py PROFILE.json -- PROGRAM ARGS...")
    with open(sys.argv[1]) as fh:
        profile = json.load(fh)
    program = sys.argv[3:]
    load(profile)
    os.execvp(program[0], program)


if __name__ == "__main__":
    main()
