"""hf:// datasets through the package, against the Hub emulator
(examples/hub_emulator.rs: an API host that redirects to a content host with
signed, expiring URLs): every sample of `ringfeed.Loader` and of
`ringfeed.torch.RingfeedDataset` (in DataLoader worker processes) is the
generator's, each shard redirected once; a private dataset needs the token,
and an error never shows it."""

import json
import os
import select
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
import ringfeed
from conftest import REPO, cli, gen, require, synth_content, tar_keys

TOKEN = "hf_PythonEmulatorToken0123456789abcdef"
SEED = 13
HUB_BUILD = "cargo build --example hub_emulator"


def hub_binary():
    """examples/hub_emulator.rs, built: $RINGFEED_HUB_EMULATOR, else the
    release build, else the debug one (scripts/test.sh's test build makes
    it). Missing, the test fails saying how to build it."""
    given = os.environ.get("RINGFEED_HUB_EMULATOR")
    candidates = [Path(given)] if given else [
        REPO / "target" / profile / "examples" / "hub_emulator" for profile in ("release", "debug")
    ]
    for path in candidates:
        if path.is_file():
            return path
    pytest.fail(f"the Hub emulator is not built (looked for {', '.join(map(str, candidates))}): "
                f"run `{HUB_BUILD}` in {REPO}", pytrace=False)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The emulator over two copies of four shards: `org/shards` (public)
    and `org/private` (the token's); yields (endpoint, shard count, the
    shards' sample keys as their tar files hold them)."""
    root = tmp_path_factory.mktemp("hub")
    shards = gen(root / "org" / "shards" / "train", shards=4, shard_size="512KiB",
                 sample_size="8KB", seed=SEED)
    shutil.copytree(root / "org" / "shards", root / "org" / "private")
    log = root / "hub.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([str(hub_binary()), str(root), "--token", TOKEN,
                                 "--private", "org/private"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline().decode().strip() if ready else ""
        if not line.startswith("http://127.0.0.1:"):
            proc.kill()
            proc.wait()
            pytest.fail(f"the Hub emulator did not start (first line {line!r}): {log.read_text()}",
                        pytrace=False)
        yield line, len(shards), tar_keys(shards)
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture()
def hub_env(hub, monkeypatch, tmp_path):
    """The Hub's variables for the emulator, no token, an empty HF_HOME."""
    endpoint, _, _ = hub
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    return monkeypatch


def stats(endpoint):
    with urllib.request.urlopen(f"{endpoint}/_hub/stats", timeout=30) as r:
        return json.loads(r.read())


def check_sample(key, fields):
    for name, data in fields.items():
        assert data == synth_content(SEED, key, name, len(data)), f"{key}.{name}"


def test_loader_reads_a_hub_dataset(hub, hub_env):
    endpoint, shards, keys = hub
    before = stats(endpoint)
    url = "hf://datasets/org/shards/train/shard-{000000..000003}.tar"
    seen = {}
    with ringfeed.Loader(url, batch_size=8, workers=2, chunk_size="128KiB") as loader:
        for b in loader:
            with b:
                for i, key in enumerate(b.keys):
                    assert key not in seen, key
                    seen[key] = {name: bytes(b[name][i]) for name in b.fields}
        assert loader.stats()["shards_total"] == shards
    assert set(seen) == keys
    for key, fields in seen.items():
        assert set(fields) == {"jpg", "cls"}
        check_sample(key, fields)
    after = stats(endpoint)
    assert after["resolves"] - before["resolves"] == shards, "one redirect a shard"
    assert after["content_authorized"] == 0


def test_a_private_dataset_needs_the_token(hub, hub_env):
    url = "hf://datasets/org/private/train"
    with pytest.raises(ringfeed.DatasetError) as e:
        ringfeed.Loader(url, batch_size=8)
    text = str(e.value)
    assert "org/private" in text and "RepoNotFound" in text and "no token was sent" in text, text
    hub_env.setenv("HF_TOKEN", "hf_NotTheRightTokenAtAll0123456789")
    with pytest.raises(ringfeed.DatasetError) as e:
        ringfeed.Loader(url, batch_size=8)
    assert "hf_NotTheRight" not in str(e.value) and "Invalid credentials" in str(e.value)
    hub_env.setenv("HF_TOKEN", TOKEN)
    n = 0
    with ringfeed.Loader(url, batch_size=8) as loader:
        for b in loader:
            with b:
                for i, key in enumerate(b.keys):
                    check_sample(key, {name: bytes(b[name][i]) for name in b.fields})
                    n += 1
    # The private copy holds the public one's shards.
    assert n == len(hub[2])
    with pytest.raises(ringfeed.DatasetError) as e:
        ringfeed.Loader("hf://datasets/org/private/train/missing.tar", batch_size=8)
    assert TOKEN not in str(e.value) and "no such file or directory" in str(e.value)


def test_offline_is_a_named_error(hub, hub_env):
    hub_env.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ringfeed.DatasetError, match="HF_HUB_OFFLINE is set"):
        ringfeed.Loader("hf://datasets/org/shards/train", batch_size=8)


def test_torch_dataset_over_hf_in_worker_processes(hub, hub_env, tmp_path):
    torch = require("torch", "RingfeedDataset over hf://")
    from ringfeed.torch import RingfeedDataset

    hub_env.setenv("HF_TOKEN", TOKEN)
    with ringfeed.Loader("hf://datasets/org/private/train", batch_size=64) as loader:
        want = sorted(k for b in loader for k in b.keys)
    # Two DataLoader workers split the samples exactly: the shards' counts
    # come from a manifest `ringfeed index` writes, its URLs hf:// ones.
    index = subprocess.run([str(cli()), "index", "hf://datasets/org/private/train"],
                           check=True, capture_output=True, text=True)
    lines = [line for line in index.stdout.splitlines() if line and not line.startswith("#")]
    assert len(lines) == hub[1], index.stdout
    assert all(line.startswith("hf://datasets/org/private/train/shard-") for line in lines), index.stdout
    assert sum(int(line.split()[2]) for line in lines) == len(want), index.stdout
    manifest = tmp_path / "hub.manifest"
    manifest.write_text(index.stdout)

    def check(batch):
        out = []
        for i, key in enumerate(batch.keys):
            check_sample(key, {name: bytes(batch[name][i]) for name in batch.fields})
            out.append(key)
        return out

    ds = RingfeedDataset(str(manifest), batch_size=16, transform=check)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, timeout=60)
    got = sorted(k for keys in dl for k in keys)
    assert got == want
