#!/usr/bin/env python3
"""The docs that run: every fenced block of README.md and docs/*.md whose
info string carries the word ``doctest`` is a whole program, and this runs
it as a reader would, against the suite's own servers.

How a block is marked (the first word is the language, as GitHub shows it):

    ```python doctest file=train.py     a program saved as train.py, run by a
                                        later marked shell block of its page
    ```python doctest                   a program run with the package's Python
    ```c doctest file=app.c             C, compiled here with -Wall -Wextra
                                        -Werror against include/ringfeed.h, and
                                        built and run by a later shell block
    ```cpp doctest file=x.cpp           C++17, the same, with the wrapper's header
    ```sh doctest                       shell commands, run with bash -e
    ```yaml doctest                     Kubernetes manifests, validated against
                                        the schemas as deploy/tests does
    ```text doctest-output              right after a marked block: what it
                                        must print (``...`` stands for anything)

The blocks of one page run in its order, in one working directory laid out
as the repository's root (`include`, `target`, `bindings`, `examples` link
to it), so a page's commands run as written there. The world they run in:

- the S3-compatible server of examples/s3_server.rs on 127.0.0.1 with the
  buckets the docs use: ``s3://my-training-bucket/train/shard-{000000..000127}.tar``
  (128 shards of 4 samples: a 32x32 JPEG ``jpg`` and a class ``cls`` 0-9),
  ``s3://my-models/mlp/model.safetensors`` (the recipe's MLP) and an empty
  ``s3://my-checkpoints``;
- the environment a reader of the docs has: ``AWS_ENDPOINT_URL`` and the
  server's credentials, ``AWS_REGION``, no AWS profile files, the
  ``ringfeed`` program (target/release) and the package's Python (.venv)
  first on PATH, and a private ``XDG_RUNTIME_DIR`` for node engines.

Each block is listed with its outcome; a marked block that cannot be run
(an unknown language or word, a program no command runs) fails, it is
never skipped. `--self-test` first runs the controls: a failing command, a
wrong output, an unknown language, a program nothing runs and C that
compiles with a warning must each be reported as failures.
"""

from __future__ import annotations

import argparse
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mdblocks as markdown  # noqa: E402  (tests/docs/mdblocks.py)
from mdblocks import REPO, Block  # noqa: E402

PYTHON = REPO / ".venv" / "bin" / "python"
CLI_DIR = REPO / "target" / "release"
# The s3_server's test credentials (tests/support/s3/mod.rs).
ACCESS_KEY = "AKIARINGFEEDTEST"
SECRET_KEY = "ringfeed-test-secret-0123456789abcdef"
BUCKETS = ("my-training-bucket", "my-models", "my-checkpoints")
# What a page's working directory links to, so its commands run "from the
# repository's root" as the docs say.
LINKED = ("include", "target", "bindings", "examples")
# Kubernetes versions the manifests are validated against, as
# deploy/tests/test_deploy.py does: the oldest in EKS standard support
# when written, and the newest the validator knows.
K8S_OLDEST = "1.31.0"
# A program's wall-clock limit: the longest, the torchrun recipe, takes
# about a minute on CI's 2 CPUs; this only keeps a hang from holding the run.
TIMEOUT_S = 600
SHELLS = ("sh", "bash", "console")
KNOWN_WORDS = {markdown.MARK}
KNOWN_ATTRS = {"file"}


@dataclass
class Outcome:
    block: Block
    what: str
    ok: bool
    detail: str = ""
    seconds: float = 0.0


def matches(expected: str, got: str) -> bool:
    """Whether `got` is `expected`, ``...`` in it standing for any text
    (doctest's ELLIPSIS); trailing spaces and blank lines do not count."""
    def norm(s):
        return "\n".join(line.rstrip() for line in s.strip("\n").splitlines())
    pattern = ".*?".join(re.escape(p) for p in norm(expected).split("..."))
    return re.fullmatch(pattern, norm(got), re.S) is not None


# -- the world ---------------------------------------------------------------


def s3_server_binary() -> Path:
    """As bindings/python/tests/conftest.py finds it: $RINGFEED_S3_SERVER,
    else the release build, else the debug one (scripts/test.sh builds it)."""
    given = os.environ.get("RINGFEED_S3_SERVER")
    candidates = [Path(given)] if given else [
        REPO / "target" / p / "examples" / "s3_server" for p in ("release", "debug")
    ]
    for path in candidates:
        if path.is_file():
            return path
    raise SystemExit(f"doc test: the S3 test server is not built (looked for {', '.join(map(str, candidates))}):"
                     " run `cargo build --example s3_server`")


def seed_shards(bucket: Path) -> None:
    """128 shards of 4 samples each: a 32x32 JPEG whose colour is its class."""
    import io
    import tarfile

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    out = bucket / "train"
    out.mkdir(parents=True)
    i = 0
    for s in range(128):
        with tarfile.open(out / f"shard-{s:06d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for _ in range(4):
                label = i % 10
                a = rng.integers(0, 60, size=(32, 32, 3)) + np.array([25 * label, 255 - 25 * label, 128])
                buf = io.BytesIO()
                Image.fromarray(a.clip(0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90)
                for name, data in ((f"{i:06d}.jpg", buf.getvalue()), (f"{i:06d}.cls", str(label).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                i += 1


def seed_weights(bucket: Path) -> None:
    """The weights recipe's MLP, as a safetensors file."""
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024))
    (bucket / "mlp").mkdir(parents=True)
    save_file(model.state_dict(), str(bucket / "mlp" / "model.safetensors"))


class World:
    """The servers, the data and the environment the programs run in."""

    def __init__(self, root: Path, servers: bool = True):
        self.root = root
        self.run_dir = root / "run"
        self.run_dir.mkdir(mode=0o700, parents=True)
        self.server = None
        self.env = dict(os.environ)
        for k in list(self.env):
            if k.startswith("AWS_") or k in ("RINGFEED_LIB", "VIRTUAL_ENV"):
                del self.env[k]
        self.env.update(
            PATH=f"{CLI_DIR}:{PYTHON.parent}:{self.env.get('PATH', '/usr/bin:/bin')}",
            XDG_RUNTIME_DIR=str(self.run_dir),
            PYTHONUNBUFFERED="1",
            # A Python process that dies of a signal (a fatal error, an
            # abort) prints its threads' stacks: a rare failure says where.
            PYTHONFAULTHANDLER="1",
            AWS_EC2_METADATA_DISABLED="true",
            # No profile files of whoever runs this: the environment alone.
            AWS_CONFIG_FILE=str(root / "no-aws-config"),
            AWS_SHARED_CREDENTIALS_FILE=str(root / "no-aws-credentials"),
        )
        if servers:
            self._start_s3()

    def _start_s3(self) -> None:
        s3_root = self.root / "s3"
        for b in BUCKETS:
            (s3_root / b).mkdir(parents=True)
        seed_shards(s3_root / "my-training-bucket")
        seed_weights(s3_root / "my-models")
        binary = s3_server_binary()
        self.s3_log = self.root / "s3_server.log"
        with open(self.s3_log, "wb") as log:
            # It stops when its stdin closes: when this process ends, however.
            self.server = subprocess.Popen([str(binary), str(s3_root)], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, stderr=log)
        ready, _, _ = select.select([self.server.stdout], [], [], 60)
        line = self.server.stdout.readline().decode().strip() if ready else ""
        if not line.startswith("http://127.0.0.1:"):
            self.close()
            raise SystemExit(f"doc test: {binary} did not start ({line!r}): {self.s3_log.read_text()}")
        self.env.update(AWS_ENDPOINT_URL=line, AWS_ACCESS_KEY_ID=ACCESS_KEY,
                        AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_REGION="us-east-1")
        print(f"doc test: S3 server {line} serving s3://{', s3://'.join(BUCKETS)}", flush=True)

    def workdir(self, page: Path) -> Path:
        d = self.root / "work" / page.stem
        if not d.exists():
            d.mkdir(parents=True)
            for name in LINKED:
                (d / name).symlink_to(REPO / name)
        return d

    def close(self) -> None:
        if self.server is not None:
            self.server.stdin.close()
            try:
                self.server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()
            self.server = None


# -- running blocks ------------------------------------------------------------


def run(cmd: list[str], cwd: Path, env: dict) -> tuple[int, str, str]:
    """Runs `cmd` in a process group of its own, which is killed whole at
    the end (a background server a page's commands started included)."""
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True, text=True)
    try:
        out, err = p.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return 124, out, err + f"\n(killed after {TIMEOUT_S} s)"
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return p.returncode, out, err


def tail(text: str, n: int = 40) -> str:
    return "\n".join(text.rstrip().splitlines()[-n:])


def ends(text: str, first: int = 60, last: int = 25) -> str:
    """The first and the last lines of a failed program's stderr: a rank's
    own words (a Python traceback, the fault handler's stacks of a signal)
    come first; a launcher's summary of the failure (torchrun's, some 30
    lines) comes last and would push them out of a tail."""
    lines = text.rstrip().splitlines()
    if len(lines) <= first + last:
        return "\n".join(lines)
    return "\n".join(lines[:first] + [f"[... {len(lines) - first - last} lines ...]"] + lines[-last:])


def check_output(block: Block, code: int, out: str, err: str) -> tuple[bool, str]:
    if code != 0:
        return False, f"exit status {code}\n--- stdout\n{tail(out)}\n--- stderr\n{ends(err)}"
    if block.output is not None and not matches(block.output.text, out):
        return False, (f"output does not match {block.output.where()}\n--- expected\n{block.output.text}"
                       f"--- got\n{tail(out)}\n--- stderr\n{tail(err)}")
    return True, ""


def validate_yaml(block: Block) -> tuple[bool, str]:
    import kubernetes_validate
    import yaml

    documents = [d for d in yaml.safe_load_all(block.text) if d is not None]
    if not documents:
        return False, "no Kubernetes object in the block"
    done = []
    for version in (K8S_OLDEST, kubernetes_validate.latest_version()):
        for d in documents:
            try:
                kubernetes_validate.validate(d, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                return False, f"{d.get('kind')}/{d.get('metadata', {}).get('name')} at Kubernetes {version}: {e}"
            done.append(f"{d['kind']}/{d['metadata']['name']}@{version}")
    return True, "valid: " + ", ".join(done)


def compile_check(block: Block, path: Path, cwd: Path, env: dict) -> tuple[bool, str]:
    if block.lang == "c":
        cmd = ["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-Iinclude", "-c", str(path), "-o", os.devnull]
    else:
        cmd = ["c++", "-std=c++17", "-Wall", "-Wextra", "-Werror", "-Iinclude", "-Ibindings/cpp", "-c",
               str(path), "-o", os.devnull]
    code, out, err = run(cmd, cwd, env)
    return code == 0, f"{' '.join(cmd)}: {tail(err)}" if code else "compiled with -Wall -Wextra -Werror"


def run_page(page: Path, world: World) -> list[Outcome]:
    """Runs the marked blocks of one page, in its order."""
    outcomes: list[Outcome] = []
    blocks = markdown.blocks(page)
    marked = [b for b in blocks if b.marked]
    outputs = {id(b.output) for b in blocks if b.output is not None}
    for b in blocks:
        if id(b) not in outputs and b.lang == "text" and markdown.OUTPUT_MARK in b.words:
            outcomes.append(Outcome(b, "output", False, "an output block that follows no marked block"))
        if b.output is not None and not b.marked:
            outcomes.append(Outcome(b.output, "output", False,
                                    f"the output of {b.where()}, which is not marked `{markdown.MARK}`"))
    if not marked:
        return outcomes
    cwd = world.workdir(page)
    for i, b in enumerate(marked):
        start = time.monotonic()
        unknown = (b.flags - KNOWN_WORDS) | (set(b.attrs) - KNOWN_ATTRS)
        name = b.attrs.get("file")
        if unknown:
            o = Outcome(b, b.lang, False, f"unknown words in the info string: {sorted(unknown)}")
        elif b.lang in ("python", "c", "cpp") and name is not None:
            (cwd / name).write_text(b.text)
            runner = next((later for later in marked[i + 1:] if later.lang in SHELLS
                           and re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w.-])", later.text)), None)
            if runner is None:
                o = Outcome(b, f"{b.lang} {name}", False,
                            f"no later `{markdown.MARK}` shell block of this page runs {name}")
            elif b.lang == "python":
                o = Outcome(b, f"python {name}", True, f"run by {runner.where()}")
            else:
                ok, detail = compile_check(b, cwd / name, cwd, world.env)
                o = Outcome(b, f"{b.lang} {name}", ok, f"{detail}; built and run by {runner.where()}")
        elif b.lang == "python":
            path = cwd / f"block-{b.line}.py"
            path.write_text(b.text)
            code, out, err = run([str(PYTHON), path.name], cwd, world.env)
            ok, detail = check_output(b, code, out, err)
            o = Outcome(b, "python", ok, detail)
        elif b.lang in SHELLS:
            path = cwd / f"block-{b.line}.sh"
            path.write_text(b.text)
            code, out, err = run(["bash", "-e", "-o", "pipefail", path.name], cwd, world.env)
            ok, detail = check_output(b, code, out, err)
            first = next((ln for ln in b.text.splitlines() if ln.strip()), "")
            o = Outcome(b, f"sh: {first[:70]}", ok, detail)
        elif b.lang == "yaml":
            ok, detail = validate_yaml(b)
            o = Outcome(b, "yaml", ok, detail)
        else:
            o = Outcome(b, b.lang or "(no language)", False, f"no way to run a `{b.lang}` block")
        o.seconds = time.monotonic() - start
        outcomes.append(o)
        mark = "ok" if o.ok else "FAILED"
        print(f"doc test: {b.where():<24} {o.what:<60} {mark} ({o.seconds:.1f} s)", flush=True)
        if not o.ok:
            print("  " + o.detail.replace("\n", "\n  "), flush=True)
    return outcomes


# -- controls --------------------------------------------------------------------


CONTROLS = {
    "a command that fails": "```sh doctest\nexit 3\n```\n",
    "a wrong output": "```sh doctest\necho 4\n```\n\n```text doctest-output\n5\n```\n",
    "an unknown language": "```brainfuck doctest\n+.\n```\n",
    "an unknown word": "```sh doctest timeout=5\ntrue\n```\n",
    "a program nothing runs": "```python doctest file=x.py\nprint(1)\n```\n",
    "C that warns": "```c doctest file=w.c\nint main(void) { int unused; return 0; }\n```\n\n"
                    "```sh doctest\ncc -o w w.c && ./w\n```\n",
    "an output of an unmarked block": "```sh\ntrue\n```\n\n```text doctest-output\n\n```\n",
}


def self_test(root: Path) -> bool:
    """Each control page must fail; the passing page must pass."""
    print("doc test: the controls (each fails, but the last one, which passes):", flush=True)
    world = World(root / "controls", servers=False)
    good = True
    pages = dict(CONTROLS, **{"the control's control: a page that passes":
                              "```sh doctest\necho 4 5 6\n```\n\n```text doctest-output\n4 ... 6\n```\n"})
    for i, (what, text) in enumerate(pages.items()):
        page = root / f"control-{i}.md"
        page.write_text(text)
        outcomes = run_page(page, world)
        should_pass = what.startswith("the control's control")
        passed = bool(outcomes) and all(o.ok for o in outcomes)
        print(f"doc test: control {what}: {'passed' if passed else 'failed'}, as it must"
              if passed == should_pass else f"doc test: control {what}: {'passed' if passed else 'failed'}: WRONG")
        good &= passed == should_pass
    world.close()
    return good


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--self-test", action="store_true", help="run the controls first")
    ap.add_argument("--only", help="only pages whose path contains this")
    ap.add_argument("--keep", action="store_true", help="keep the working directory (printed)")
    a = ap.parse_args()
    # Short: node engines' sockets live under it (a socket path holds 107 bytes).
    root = Path(tempfile.mkdtemp(prefix="rf-docs-", dir="/tmp"))
    try:
        if a.self_test and not self_test(root):
            print("doc test: a control did not fail as it must: the harness cannot be trusted")
            return 1
        pages = [p for p in markdown.docs() if not a.only or a.only in str(p)]
        world = World(root / "world")
        try:
            outcomes = [o for page in pages for o in run_page(page, world)]
        finally:
            world.close()
        failed = [o for o in outcomes if not o.ok]
        print(f"doc test: {len(outcomes)} programs in {len(pages)} pages, in {root}" if a.keep else
              f"doc test: {len(outcomes)} programs in {len(pages)} pages")
        print(f"{len(outcomes) - len(failed)} passed, {len(failed)} failed")
        return 1 if failed or not outcomes else 0
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
