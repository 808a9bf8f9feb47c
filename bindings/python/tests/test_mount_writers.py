"""`ringfeed mount`: a half-written file never becomes a whole one, whatever
pid namespace its writer is in (docs/mount.md, "What a write does").

The kernel names a FUSE request's caller by its pid in the mount's pid
namespace, and by 0 when the caller is not visible there (the Kubernetes
layout: the mount in a driver's pod, the writer in the trainer's). A close
and a killed writer's death look alike on the wire; only the closing
thread, looked up in the mount's /proc, tells them apart. Where it cannot
be looked up, only `fsync` completes a file.

Each test makes the layouts with util-linux (`unshare`, `nsenter`,
`setpriv`) inside a mount namespace of its own (`private_mounts`: nothing
is mounted on the machine's own tree): the mount in a pid namespace of its
own and the writer outside it, the reverse, the mount with a /proc of
another pid namespace, the mount under a /proc with `hidepid=2`, the mount
without the right to read a writer's exit code. In each, a writer
SIGKILLed after 6 of its 12 MiB must leave no file (local directory) or no
object and no upload (the S3 test server), and the control — the same
writer finishing as that layout lets it (a close where the mount sees the
writer, an fsync and a close where it cannot) — leaves its whole file.
Needs root (CAP_SYS_ADMIN for namespaces and mounts) and /dev/fuse.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import cli, require, run_s3_server, skip_for_environment

if os.geteuid() != 0:
    skip_for_environment("not root: pid and mount namespaces cannot be made")
if not Path("/dev/fuse").exists():
    skip_for_environment("no /dev/fuse on this machine: FUSE mounts cannot be made")
if subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode != 0:
    # util-linux is installed everywhere the suite runs; a refusal is the
    # container's (no CAP_SYS_ADMIN), which no install changes.
    skip_for_environment("`unshare --mount` is refused here (no CAP_SYS_ADMIN)")

MiB = 1 << 20
BLOCK = bytes(range(256)) * 4096
WHOLE = BLOCK * 12

# Where the mount runs (the command put before `ringfeed mount`).
# In the test's namespaces: the machine's pid namespace.
HERE = []
# A pid namespace of its own with a /proc of it (a driver pod).
OWN_PIDNS = ["unshare", "--pid", "--fork", "--mount-proc", "--propagation", "unchanged", "--"]
# A pid namespace of its own, the /proc left the machine's: the pids the
# kernel gives name other processes there.
OWN_PIDNS_HOST_PROC = ["unshare", "--pid", "--fork", "--"]
# Root without CAP_SYS_PTRACE: a writer running as root with all
# capabilities is not the mount's to ptrace-read.
NO_PTRACE = ["setpriv", "--bounding-set", "-sys_ptrace", "--inh-caps", "-sys_ptrace", "--"]
# The same, under a /proc mounted with hidepid=2 whose exempt group
# (`gid=`, root's group when not given) is one the mount is not in: the
# writer's entry is hidden from it.
HIDEPID = ["unshare", "--mount", "--propagation", "unchanged", "--", "sh", "-c",
           'mount -t proc -o hidepid=2,gid=65534 proc /proc && exec "$@"', "sh", *NO_PTRACE]

# The writer: opens PATH, writes 6 MiB, then as HOW says. It prints what
# its close answered and exits 0 (5 when the close failed).
WRITER = r"""
import os, signal, subprocess, sys
path, how = sys.argv[1], sys.argv[2]
block = bytes(range(256)) * 4096
f = open(path, "wb")
for _ in range(6):
    f.write(block)
f.flush()
if how == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if how == "spawn":
    # A child process closes its copy of the descriptor at its exec.
    subprocess.run(["true"], check=True)
for _ in range(6):
    f.write(block)
f.flush()
if how in ("fsync", "spawn", "fsync-kill"):
    os.fsync(f.fileno())
if how == "fsync-kill":
    os.kill(os.getpid(), signal.SIGKILL)
if how == "exit":
    # Leaves with the file open: the kernel closes it as the process exits.
    os._exit(0)
try:
    f.close()
except OSError as e:
    print("close:", os.strerror(e.errno))
    sys.exit(5)
print("closed")
"""

KILLED = (-signal.SIGKILL, 128 + signal.SIGKILL)

UNSEEN = "was closed before an fsync by a process whose close cannot be told from its death"


def mounted(holder_pid, path):
    """Whether `path` is a mount point in the namespace of `holder_pid`."""
    with open(f"/proc/{holder_pid}/mountinfo") as f:
        return any(line.split(" ")[4] == str(path) for line in f)


def descendants(pid):
    """The pids below `pid` (from every process's parent in /proc)."""
    parents = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        # The parent is the second field after the command's `)`.
        parents[int(entry)] = int(stat[stat.rindex(")") + 1:].split()[1])
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        kids = sorted(k for k, parent in parents.items() if parent == p)
        out += kids
        todo += kids
    return out


@dataclass
class Namespace:
    """A mount namespace of the test's own, held by a sleeping process."""
    pid: int

    def cmd(self, *args):
        return ["nsenter", f"--mount=/proc/{self.pid}/ns/mnt", "--", *map(str, args)]


@contextmanager
def private_mounts(tmp_path):
    """A mount namespace of the test's own (`unshare --mount`, everything
    private, so nothing reaches the machine's mounts) in which `tmp_path` is
    made a shared mount: a FUSE mount made below it from a namespace copied
    from this one (the mount's own) appears here too."""
    holder = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
         'mount --bind "$0" "$0" && mount --make-shared "$0" && echo ready && exec sleep 3600',
         str(tmp_path)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"ready\n", "the test's mount namespace was not made"
        yield Namespace(holder.pid)
    finally:
        holder.kill()
        holder.wait()


@dataclass
class Mount:
    path: Path
    log: Path
    daemon: int

    def log_text(self):
        return self.log.read_text(errors="replace")


@contextmanager
def mount(ns, wrap, source, tmp_path, *args, env=None, name="mnt"):
    """`ringfeed mount SOURCE DIR ARGS...` run under `wrap` in namespace `ns`
    until the block ends; then SIGTERM to the mount process itself, which
    must unmount and exit 0."""
    mnt, log = tmp_path / name, tmp_path / f"{name}.log"
    mnt.mkdir()
    with open(log, "wb") as out:
        proc = subprocess.Popen(ns.cmd(*wrap, cli(), "mount", source, mnt, *args),
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env)
    m = Mount(mnt, log, 0)
    try:
        deadline = time.monotonic() + 60
        while not mounted(ns.pid, mnt) or " mounted on " not in m.log_text():
            if proc.poll() is not None:
                pytest.fail(f"ringfeed mount exited {proc.returncode}: {m.log_text()}", pytrace=False)
            if time.monotonic() > deadline:
                pytest.fail(f"ringfeed mount did not mount in 60 s: {m.log_text()}", pytrace=False)
            time.sleep(0.02)
        # The mount process itself (below unshare, nsenter, setpriv): the
        # one whose command is the CLI's (the kernel keeps 15 bytes of it).
        below = [proc.pid, *descendants(proc.pid)]
        comm = cli().name[:15]
        m.daemon = next(p for p in below if Path(f"/proc/{p}/comm").read_text().strip() == comm)
        yield m
    finally:
        if m.daemon:
            os.kill(m.daemon, signal.SIGTERM)
        else:
            for p in [*descendants(proc.pid), proc.pid]:
                os.kill(p, signal.SIGKILL)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        still = mounted(ns.pid, mnt)
        if still:
            subprocess.run(ns.cmd("umount", "-l", mnt))
        assert not still, f"still mounted after SIGTERM: {m.log_text()}"
        assert code == 0, f"ringfeed mount exited {code}: {m.log_text()}"


# Where the writer runs (the command put before it).
WRITER_HERE = []
# A pid namespace of its own (a pod's), the writer not its init (an init
# cannot SIGKILL itself): sh is.
WRITER_OWN_PIDNS = ["unshare", "--pid", "--fork", "--mount-proc", "--", "sh", "-c", '"$@"; exit $?', "sh"]


def write(ns, wrap, path, how, program=None):
    """Runs the writer (or `program PATH HOW`) at `path` under `wrap` in
    namespace `ns`: its return code and output."""
    argv = program or [sys.executable, "-c", WRITER]
    p = subprocess.run(ns.cmd(*wrap, *argv, path, how), capture_output=True, text=True, timeout=120)
    # Shown with a failing test's output.
    print(f"{path.name} {how}: {p.returncode} {p.stdout!r} {p.stderr!r}")
    return p.returncode, p.stdout.strip()


def test_a_writer_outside_the_mounts_pid_namespace_completes_a_file_only_by_fsync(tmp_path):
    """The Kubernetes layout, with a local directory: the mount in a pid
    namespace of its own, the writers in the machine's (pid 0 to the
    mount). Killed after 6 of 12 MiB: no file, and a line saying why.
    Closed whole without an fsync: the close answers EIO, no file (a close
    cannot be told from a death there). The control: fsync'd, then closed
    or killed, the whole file; a writer whose child process closes its copy
    of the descriptor at an exec, then fsyncs, the whole file too."""
    src = tmp_path / "src"
    src.mkdir()
    with private_mounts(tmp_path) as ns, mount(ns, OWN_PIDNS, src, tmp_path) as m:
        assert write(ns, WRITER_HERE, m.path / "half.bin", "kill")[0] in KILLED
        assert write(ns, WRITER_HERE, m.path / "closed.bin", "close") == (5, "close: Input/output error")
        assert write(ns, WRITER_HERE, m.path / "synced.bin", "fsync") == (0, "closed")
        assert write(ns, WRITER_HERE, m.path / "synced-killed.bin", "fsync-kill")[0] in KILLED
        assert write(ns, WRITER_HERE, m.path / "spawned.bin", "spawn") == (0, "closed")
    log = m.log_text()
    for name in ("synced.bin", "synced-killed.bin", "spawned.bin"):
        assert (src / name).read_bytes() == WHOLE, name
    assert sorted(p.name for p in src.iterdir()) == ["spawned.bin", "synced-killed.bin", "synced.bin"]
    for name in ("half.bin", "closed.bin"):
        assert re.search(rf"`{re.escape(str(src / name))}` {UNSEEN} \(the kernel gave pid 0", log), log
        assert f"wrote `{src / name}`" not in log, log
    assert "uploads 3, uploads_aborted 2" in log, log


def test_a_writer_outside_the_mounts_pid_namespace_leaves_no_object_in_s3(tmp_path):
    """The same layout over the S3 test server: the killed writer leaves no
    object and no multipart upload; the fsync'd writer its whole object."""
    (tmp_path / "s3").mkdir()
    with run_s3_server(tmp_path / "s3") as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(AWS_ACCESS_KEY_ID=server.access_key, AWS_SECRET_ACCESS_KEY=server.secret_key,
                   AWS_REGION="us-east-1", AWS_CONFIG_FILE="/nonexistent",
                   AWS_SHARED_CREDENTIALS_FILE="/nonexistent")
        objects = server.root / server.bucket / "ckpt"
        with private_mounts(tmp_path) as ns, \
                mount(ns, OWN_PIDNS, f"s3://{server.bucket}/ckpt/", tmp_path,
                      "--endpoint-url", server.endpoint, "--part-size", "5MiB", env=env) as m:
            assert write(ns, WRITER_HERE, m.path / "half.bin", "kill")[0] in KILLED
            assert write(ns, WRITER_HERE, m.path / "synced.bin", "fsync") == (0, "closed")
            log = m.log_text()
        assert not (objects / "half.bin").exists()
        assert (objects / "synced.bin").read_bytes() == WHOLE
        assert sorted(p.name for p in objects.iterdir()) == ["synced.bin"]
        assert not list(server.root.glob(".upload-*.json")), list(server.root.iterdir())
        assert f"`s3://{server.bucket}/ckpt/half.bin` {UNSEEN}" in log, log


def test_a_writer_in_a_pid_namespace_below_the_mounts_is_seen(tmp_path):
    """The reverse layout: the mount in the machine's pid namespace, the
    writer in one of its own below it, which the mount sees. Killed: no
    file, the log naming the kill. The control: closed without an fsync,
    its whole file."""
    src = tmp_path / "src"
    src.mkdir()
    with private_mounts(tmp_path) as ns, mount(ns, HERE, src, tmp_path) as m:
        assert write(ns, WRITER_OWN_PIDNS, m.path / "half.bin", "kill")[0] in KILLED
        assert write(ns, WRITER_OWN_PIDNS, m.path / "closed.bin", "close") == (0, "closed")
        log = m.log_text()
    assert (src / "closed.bin").read_bytes() == WHOLE
    assert sorted(p.name for p in src.iterdir()) == ["closed.bin"]
    assert re.search(rf"the writer of `{re.escape(str(src / 'half.bin'))}` \(thread \d+, signal 9\) "
                     r"was killed before closing it", log), log


def test_a_mount_whose_proc_is_another_pid_namespaces_sees_no_writer(tmp_path):
    """The mount in a pid namespace of its own whose /proc was left the
    machine's, the writer in the mount's namespace: the kernel gives the
    writer's pid there, which names another process in that /proc. The
    mount says so when it starts and looks nothing up: killed, no file;
    the control, fsync'd, the whole file."""
    src = tmp_path / "src"
    src.mkdir()
    with private_mounts(tmp_path) as ns, mount(ns, OWN_PIDNS_HOST_PROC, src, tmp_path) as m:
        inside = ["nsenter", f"--target={m.daemon}", "--pid", "--"]
        assert write(ns, inside, m.path / "half.bin", "kill")[0] in KILLED
        assert write(ns, inside, m.path / "synced.bin", "fsync") == (0, "closed")
        log = m.log_text()
    assert sorted(p.name for p in src.iterdir()) == ["synced.bin"]
    assert (src / "synced.bin").read_bytes() == WHOLE
    assert "mount: /proc is of a pid namespace other than the mount's own" in log, log
    assert re.search(rf"`{re.escape(str(src / 'half.bin'))}` {UNSEEN} \(the mount's /proc is of "
                     "a pid namespace other than", log), log


def test_under_hidepid_a_writer_is_unseen_and_completes_by_fsync(tmp_path):
    """The mount under a /proc mounted with hidepid=2, as root without
    CAP_SYS_PTRACE and out of the group that /proc exempts: the writer's
    /proc entry is hidden. Killed: no file. Closed
    without an fsync: EIO, no file. The control: fsync'd, the whole file."""
    src = tmp_path / "src"
    src.mkdir()
    with private_mounts(tmp_path) as ns, mount(ns, HIDEPID, src, tmp_path) as m:
        assert write(ns, WRITER_HERE, m.path / "half.bin", "kill")[0] in KILLED
        assert write(ns, WRITER_HERE, m.path / "closed.bin", "close") == (5, "close: Input/output error")
        assert write(ns, WRITER_HERE, m.path / "synced.bin", "fsync") == (0, "closed")
        log = m.log_text()
    assert sorted(p.name for p in src.iterdir()) == ["synced.bin"]
    assert (src / "synced.bin").read_bytes() == WHOLE
    assert re.search(rf"`{re.escape(str(src / 'half.bin'))}` {UNSEEN} \(/proc/\d+ cannot be read", log), log


def test_a_mount_that_may_not_read_a_writers_exit_code_does_not_take_a_kill_for_an_exit(tmp_path):
    """The same mount with the machine's /proc, no hidepid: it sees the
    writer, and a close while the writer runs is a close (the control: its
    whole file); but the exit code of a dying writer reads 0 to it (it may
    not ptrace-read the writer), as an exit(0) would: killed, no file; and
    so, exiting with the file open, no file either (where the mount may
    read the exit code, that leaves the whole file: the last test)."""
    src = tmp_path / "src"
    src.mkdir()
    with private_mounts(tmp_path) as ns, mount(ns, NO_PTRACE, src, tmp_path) as m:
        assert write(ns, WRITER_HERE, m.path / "half.bin", "kill")[0] in KILLED
        assert write(ns, WRITER_HERE, m.path / "closed.bin", "close") == (0, "closed")
        assert write(ns, WRITER_HERE, m.path / "exited.bin", "exit") == (0, "")
        log = m.log_text()
    assert sorted(p.name for p in src.iterdir()) == ["closed.bin"]
    assert (src / "closed.bin").read_bytes() == WHOLE
    assert re.search(rf"`{re.escape(str(src / 'half.bin'))}` {UNSEEN} \(process \d+ is exiting and "
                     "its exit code is hidden", log), log


FORKED = r"""
import os, signal, sys
path, how = sys.argv[1], sys.argv[2]
block = bytes(range(256)) * 4096
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
pid = os.fork()
if pid == 0:
    # The child writes half and dies of a signal (or, the control, writes
    # all and leaves).
    for _ in range(6):
        os.write(fd, block)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    for _ in range(6):
        os.write(fd, block)
    os._exit(0)
_, status = os.waitpid(pid, 0)
try:
    os.close(fd)
except OSError as e:
    print("close:", os.strerror(e.errno))
    sys.exit(5)
print("closed")
"""

LEADER = r"""
/* The main thread opens the file and leaves (pthread_exit: the process
   lives on, its leader a zombie); another thread writes 6 MiB, then as
   argv[2] says: "kill" (SIGKILL to the process), "exit" (exit(0) with the
   file open), "fsync" (the rest, fsync, close). */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int fd;
static const char *how;
static char block[1 << 20];

static void put(int n) {
    for (int i = 0; i < n; i++)
        if (write(fd, block, sizeof block) != (ssize_t)sizeof block) {
            perror("write");
            exit(2);
        }
}

static void *writer(void *arg) {
    (void)arg;
    put(6);
    if (strcmp(how, "kill") == 0)
        kill(getpid(), SIGKILL);
    put(6);
    if (strcmp(how, "exit") == 0)
        exit(0);
    if (fsync(fd) != 0 || close(fd) != 0) {
        perror("fsync, close");
        exit(5);
    }
    printf("closed\n");
    exit(0);
}

int main(int argc, char **argv) {
    pthread_t t;
    if (argc != 3)
        return 64;
    for (size_t i = 0; i < sizeof block; i++)
        block[i] = (char)(i & 0xff);
    how = argv[2];
    fd = open(argv[1], O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) {
        perror("open");
        return 1;
    }
    if (pthread_create(&t, NULL, writer, NULL) != 0)
        return 1;
    pthread_exit(NULL);
}
"""


def test_the_writer_is_the_process_that_wrote_and_the_thread_that_closed(tmp_path):
    """Where the mount sees the writers. A forked child that wrote half and
    was killed, its parent closing the descriptor after: no file, the
    parent's close EIO (the control: the child writing all, the parent's
    close leaves the whole file). A writer whose main thread has exited
    (a zombie leader) and whose other thread writes: killed, no file; its
    exit(0) with the file open, the whole file (the closing thread is
    looked at, not the leader). The same program from another pid
    namespace, fsync'd, the whole file."""
    exe = tmp_path / "leader"
    (tmp_path / "leader.c").write_text(LEADER)
    subprocess.run([shutil.which("cc") or "cc", "-O1", "-Wall", "-Werror", "-pthread",
                    str(tmp_path / "leader.c"), "-o", str(exe)], check=True)
    forked = [sys.executable, "-c", FORKED]
    src = tmp_path / "src"
    src.mkdir()
    with private_mounts(tmp_path) as ns:
        with mount(ns, HERE, src, tmp_path) as m:
            assert write(ns, WRITER_HERE, m.path / "forked-half.bin", "kill", forked) == \
                (5, "close: Input/output error")
            assert write(ns, WRITER_HERE, m.path / "forked-whole.bin", "all", forked) == (0, "closed")
            assert write(ns, WRITER_HERE, m.path / "leader-half.bin", "kill", [exe])[0] in KILLED
            assert write(ns, WRITER_HERE, m.path / "leader-exit.bin", "exit", [exe]) == (0, "")
            assert write(ns, WRITER_HERE, m.path / "exited.bin", "exit") == (0, "")
        with mount(ns, OWN_PIDNS, src, tmp_path, name="pidns") as m:
            assert write(ns, WRITER_HERE, m.path / "leader-synced.bin", "fsync", [exe]) == (0, "closed")
            assert write(ns, WRITER_HERE, m.path / "leader-half2.bin", "kill", [exe])[0] in KILLED
    assert sorted(p.name for p in src.iterdir()) == \
        ["exited.bin", "forked-whole.bin", "leader-exit.bin", "leader-synced.bin"]
    for name in ("exited.bin", "forked-whole.bin", "leader-exit.bin", "leader-synced.bin"):
        assert (src / name).read_bytes() == WHOLE, name


TORCH_WRITER = r"""
import os, sys, torch
path, how = sys.argv[1], sys.argv[2]
state = {"w": torch.arange(3 << 20, dtype=torch.int32)}
if how == "save":
    try:
        torch.save(state, path)
    except (OSError, RuntimeError) as e:
        print("save:", type(e).__name__, file=sys.stdout)
        print(e, file=sys.stderr)
        sys.exit(5)
else:
    # The recipe of docs/mount.md: a file object, flushed and fsync'd.
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
print("saved")
"""


def test_torch_save_from_another_pid_namespace_needs_an_fsync(tmp_path):
    """torch.save(obj, path) does not fsync: from a pid namespace the mount
    cannot see, its close cannot be told from a death and no file is left.
    The recipe docs/mount.md gives (torch.save into a file object, then
    fsync) leaves the checkpoint, read back whole by torch.load."""
    torch = require("torch", "torch.save through a mount in another pid namespace")
    src = tmp_path / "src"
    src.mkdir()
    program = [sys.executable, "-c", TORCH_WRITER]
    with private_mounts(tmp_path) as ns, mount(ns, OWN_PIDNS, src, tmp_path) as m:
        saved = write(ns, WRITER_HERE, m.path / "plain.pt", "save", program)
        assert write(ns, WRITER_HERE, m.path / "synced.pt", "fsync", program) == (0, "saved")
        log = m.log_text()
    assert sorted(p.name for p in src.iterdir()) == ["synced.pt"], saved
    assert f"`{src / 'plain.pt'}` {UNSEEN}" in log, log
    loaded = torch.load(src / "synced.pt")
    assert torch.equal(loaded["w"], torch.arange(3 << 20, dtype=torch.int32))
    # What torch.save itself says of the failed close.
    assert saved == (5, "save: RuntimeError"), saved


def test_shell_tools_from_another_pid_namespace_fail_at_close_but_dd_conv_fsync(tmp_path):
    """`cp`, `touch` and a shell's `>` do not fsync: from a pid namespace the
    mount cannot see, each leaves nothing; `cp` and `touch` say so (their
    close's EIO), the shell cannot (its command's exit closes the file).
    The control, as docs/mount.md gives it: `dd conv=fsync`, which opens
    its output, moves it onto stdout and closes the original before
    writing, leaves the whole copy, and an empty marker."""
    src = tmp_path / "src"
    src.mkdir()
    data = tmp_path / "data.bin"
    data.write_bytes(WHOLE)
    with private_mounts(tmp_path) as ns, mount(ns, OWN_PIDNS, src, tmp_path) as m:
        def sh(command):
            p = subprocess.run(ns.cmd("sh", "-c", command), capture_output=True, text=True, timeout=120)
            return p.returncode, p.stderr.strip()
        copied = sh(f"cp {data} {m.path}/copied.bin")
        touched = sh(f"touch {m.path}/touched")
        echoed = sh(f"echo hello > {m.path}/echoed.txt")
        dd = sh(f"dd if={data} of={m.path}/dd.bin bs=8M conv=fsync status=none")
        marker = sh(f"dd if=/dev/null of={m.path}/_SUCCESS conv=fsync status=none")
        log = m.log_text()
    failed = "failed to close '{}': Input/output error"
    assert copied == (1, "cp: " + failed.format(m.path / "copied.bin"))
    assert touched == (1, "touch: " + failed.format(m.path / "touched"))
    # The shell's close of its redirection reaches no one: only the log says.
    assert echoed == (0, "")
    assert f"`{src / 'echoed.txt'}` {UNSEEN}" in log, log
    assert (dd, marker) == ((0, ""), (0, ""))
    assert sorted(p.name for p in src.iterdir()) == ["_SUCCESS", "dd.bin"]
    assert (src / "dd.bin").read_bytes() == WHOLE
    assert (src / "_SUCCESS").read_bytes() == b""
