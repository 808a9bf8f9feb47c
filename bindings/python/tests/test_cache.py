"""The local cache tier from Python: a second loader over the same S3 shards
reads them from `cache_dir` (the stats say so), samples unchanged; a
directory that cannot be a cache is named in the notes and the loader still
streams."""

import ringfeed

from conftest import all_samples, gen, synth_content, tar_keys


def test_a_second_loader_reads_s3_shards_from_the_cache(s3_server, tmp_path):
    paths = gen(s3_server.root / s3_server.bucket / "cached", shards=2, shard_size="1MiB")
    url = f"s3://{s3_server.bucket}/cached/shard-{{000000..000001}}.tar"
    cache = tmp_path / "cache"
    kw = dict(batch_size=8, chunk_size="1MiB", cache_dir=str(cache), cache_min_free=0,
              cache_fill="always", **s3_server.config())

    with ringfeed.Loader(url, **kw) as loader:
        first = all_samples(loader)
        s1 = loader.stats()
    assert s1["cache_misses"] == 2, s1
    # Closing waited for the background writes: both entries are whole.
    assert len(list(cache.glob("*.rfc"))) == 2

    with ringfeed.Loader(url, **kw) as loader:
        second = all_samples(loader)
        s2 = loader.stats()
    assert s2["cache_hits"] == 2, s2
    assert s2["cache_bytes"] == sum(p.stat().st_size for p in map(type(cache), paths))
    assert second == first


def test_a_cache_dir_that_is_a_file_leaves_the_loader_streaming(s3_server, tmp_path):
    gen(s3_server.root / s3_server.bucket / "nocache", shards=1, shard_size="1MiB")
    url = f"s3://{s3_server.bucket}/nocache/shard-000000.tar"
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache would go")
    with ringfeed.Loader(url, batch_size=8, chunk_size="1MiB", cache_dir=str(blocker), **s3_server.config()) as loader:
        got = all_samples(loader)
        stats = loader.stats()
    assert got
    assert stats["cache_uncached"] == 1, stats
    assert any(str(blocker) in n and "cannot create it" in n for n in stats["notes"]), stats["notes"]


def test_writing_into_delivered_batches_never_changes_what_is_cached(s3_server, tmp_path):
    """A consumer that writes into every batch it gets (what an in-place op
    on a tensor view of it does) before the cache writer stores the chunk:
    the next loader, reading the cache, gets the source bytes: the entries
    carry the checksums of the bytes read, so one whose bytes changed fails
    its first read, is dropped and fetched again. (The control, the
    checksums taken as the writer writes, is in tests/cache_paced.rs: it
    needs the test build's switches.)"""
    import ctypes

    paths = gen(s3_server.root / s3_server.bucket / "written", shards=2, shard_size="1MiB", seed=5)
    url = f"s3://{s3_server.bucket}/written/shard-{{000000..000001}}.tar"
    cache = tmp_path / "cache"
    kw = dict(batch_size=8, chunk_size="1MiB", cache_dir=str(cache), cache_min_free=0,
              cache_fill="always", **s3_server.config())
    keys = tar_keys(paths)
    written = 0
    with ringfeed.Loader(url, **kw) as loader:
        for b in loader:
            with b:
                jpg = b["jpg"]
                for addr, n in zip(jpg.addresses, jpg.lengths):
                    ctypes.memset(int(addr), 0xA5, min(int(n), 64))
                    written += 1
    assert written == len(keys)
    # Closing waited for the writes: every shard is stored, under the sums
    # of what was read.
    assert len(list(cache.glob("*.rfc"))) == 2

    with ringfeed.Loader(url, **kw) as loader:
        second = all_samples(loader)
        s2 = loader.stats()
    assert (s2["cache_hits"], s2["cache_misses"]) == (2, 0), s2
    # The entries found changed were dropped; the others are still there.
    assert len(list(cache.glob("*.rfc"))) == 2 - s2["cache_corrupt"], s2
    assert set(second) == keys
    for key, fields in second.items():
        for name, data in fields.items():
            assert data == synth_content(5, key, name, len(data)), (key, name, s2)
