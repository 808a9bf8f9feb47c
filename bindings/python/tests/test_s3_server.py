"""The S3-compatible test server (examples/s3_server.rs) runs under pytest:
it answers S3's XML errors, and the engine reads a shard from it with the
fixture's configuration."""

import urllib.error
import urllib.request

import pytest
import ringfeed

from conftest import all_samples, gen


def test_an_unsigned_request_gets_an_s3_error(s3_server):
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(s3_server.endpoint + "/", timeout=30)
    body = e.value.read().decode()
    assert e.value.code == 403
    assert "<Error><Code>AccessDenied</Code>" in body, body
    assert (s3_server.root / s3_server.bucket).is_dir()


def test_the_engine_reads_a_shard_with_the_fixtures_config(s3_server):
    [path] = gen(s3_server.root / s3_server.bucket / "read", shards=1)
    with ringfeed.Loader(path, batch_size=8) as loader:
        want = all_samples(loader)
    assert want
    url = f"s3://{s3_server.bucket}/read/shard-000000.tar"
    with ringfeed.Loader(url, batch_size=8, **s3_server.config()) as loader:
        assert all_samples(loader) == want
