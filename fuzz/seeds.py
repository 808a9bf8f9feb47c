#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into fuzz/corpus/<target>/.

Seeds are small real inputs: tar shards from the project's generator
(`ringfeed gen`, when RINGFEED names the binary), Python's tarfile (ustar,
GNU, pax) and GNU tar (v7, oldgnu, gnu, ustar, posix; long names, links,
sparse files), HTTP response heads, configurations, manifests, resume
states and S3 XML taken from the tests. Run from anywhere:

    RINGFEED=target/debug/ringfeed python3 fuzz/seeds.py
"""

import io
import os
import struct
import subprocess
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# --- tar_walk: [limit selector][cut count][cuts, u32 LE each][archive] ---

def tar_seed(name, archive, cuts=()):
    prefix = bytes([0, len(cuts)]) + b"".join(struct.pack("<I", c) for c in cuts)
    put("tar_walk", name, prefix + archive)


def members():
    return [
        ("000001.jpg", b"\xff\xd8" + bytes(range(200))),
        ("000001.cls", b"3"),
        ("000002.JSON", b'{"a": 1}'),
        ("000002.seg.png", b"\x89PNG" * 40),
        ("d/" + "long-directory-name-" * 6 + "/000003.txt", b"hello" * 30),
        ("000004.empty", b""),
    ]


def python_tar(fmt):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        d = tarfile.TarInfo("somedir")
        d.type = tarfile.DIRTYPE
        t.addfile(d)
        for n, data in members():
            i = tarfile.TarInfo(n)
            i.size = len(data)
            t.addfile(i, io.BytesIO(data))
        link = tarfile.TarInfo("000001.lnk")
        link.type = tarfile.SYMTYPE
        link.linkname = "000001.jpg"
        t.addfile(link)
    return buf.getvalue()


def gnu_tar(fmt, extra=()):
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "src")
        os.makedirs(os.path.join(src, "sub"))
        for n, data in members()[:4]:
            with open(os.path.join(src, n), "wb") as f:
                f.write(data)
        os.link(os.path.join(src, "000001.jpg"), os.path.join(src, "000005.jpg"))
        with open(os.path.join(src, "sub", "000006.sparse"), "wb") as f:
            f.seek(3000)
            f.write(b"end")
        out = os.path.join(d, "a.tar")
        subprocess.run(
            ["tar", "--format=" + fmt, *extra, "--sort=name", "--mtime=@0",
             "--owner=0", "--group=0", "-C", src, "-cf", out, "."],
            check=True,
        )
        with open(out, "rb") as f:
            return f.read()


def tar_seeds():
    for fmt, name in [(tarfile.USTAR_FORMAT, "ustar"), (tarfile.GNU_FORMAT, "gnu"),
                      (tarfile.PAX_FORMAT, "pax")]:
        a = python_tar(fmt)
        tar_seed("tarfile-" + name, a)
        tar_seed("tarfile-" + name + "-cut", a, (511, 512, 1000, 1537))
    try:
        for fmt in ["v7", "oldgnu", "gnu", "ustar", "posix"]:
            tar_seed("gnutar-" + fmt, gnu_tar(fmt))
        tar_seed("gnutar-gnu-sparse", gnu_tar("gnu", ["--sparse"]))
        tar_seed("gnutar-posix-sparse", gnu_tar("posix", ["--sparse"]))
        tar_seed("gnutar-gnu-atime", gnu_tar("gnu", ["--incremental"]))
    except (OSError, subprocess.CalledProcessError) as e:
        print("GNU tar seeds skipped:", e)
    ringfeed = os.environ.get("RINGFEED")
    if ringfeed:
        with tempfile.TemporaryDirectory() as d:
            subprocess.run([ringfeed, "gen", d, "--shards", "1", "--shard-size", "12KB",
                            "--sample-size", "700", "--fields", "jpg,cls,json"],
                           check=True, stdout=subprocess.DEVNULL)
            shard = sorted(f for f in os.listdir(d) if f.endswith(".tar"))[0]
            with open(os.path.join(d, shard), "rb") as f:
                a = f.read()
            tar_seed("synth", a)
            tar_seed("synth-cut", a, (100, 4096, 4097, 8000))


# --- http_response: [flags][start u32][len u32][cut count][cuts][response] ---

def http_seed(name, resp, start=0, length=10, open_end=False, cuts=()):
    flags = (1 if open_end else 0) | (2 if start else 0)
    prefix = bytes([flags]) + struct.pack("<II", start >> 8 if start else 0, length)
    prefix += bytes([len(cuts)]) + b"".join(struct.pack("<I", c) for c in cuts)
    put("http_response", name, prefix + resp.encode())


def http_seeds():
    http_seed("206", "HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\n"
              "Content-Range: bytes 0-9/100\r\nConnection: keep-alive\r\n\r\n0123456789",
              cuts=(5, 17, 40))
    http_seed("206-start", "HTTP/1.1 206 P\r\nContent-Length: 10\r\n"
              "Content-Range: bytes 256-265/1000\r\n\r\n0123456789", start=256)
    http_seed("206-end", "HTTP/1.1 206 P\r\nContent-Length: 4\r\nContent-Range: bytes 0-3/4\r\n\r\nabcd",
              open_end=True)
    http_seed("206-star", "HTTP/1.1 206 P\r\nContent-Range: bytes 0-9/*\r\n\r\n", open_end=True)
    http_seed("200", "HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nabcdefg", open_end=True)
    http_seed("200-chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
    http_seed("416", "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */0\r\n"
              "Content-Length: 0\r\n\r\n", open_end=True)
    http_seed("503", "HTTP/1.1 503 Slow Down\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
    http_seed("404-s3", "HTTP/1.1 404 Not Found\r\nContent-Type: application/xml\r\n"
              "Content-Length: 60\r\n\r\n<Error><Code>NoSuchKey</Code><Message>x</Message></Error>")
    http_seed("http10", "HTTP/1.0 206 P\r\nContent-Range: bytes 0-9/10\r\n\r\n")


def request_seed(name, url, start=0, length=10):
    put("http_request", name, struct.pack("<II", start, length) + url.encode())


def request_seeds():
    request_seed("plain", "http://127.0.0.1:8080/data/shard-000001.tar")
    request_seed("https", "https://example.com/a/b.tar?x=1&y=2", 1 << 20, 8 << 20)
    request_seed("ipv6", "http://[::1]:9000/bucket/key.tar")
    request_seed("noport", "http://host/")
    request_seed("s3-style", "https://bucket.s3.us-east-1.amazonaws.com/train/shard%20000.tar")


def other_seeds():
    for i, c in enumerate([
        '{"urls": "a.tar"}',
        '{"urls": ["s3://b/train/shard-{000000..000127}.tar"], "memory_budget": "256MiB", '
        '"chunk_size": 1048576, "batch_size": 64, "shuffle_buffer": 1000, "seed": 7}',
        '{"urls": "a.tar", "node": "/run/x.sock", "cpus": "0-3,8", "numa_node": "auto"}',
        '{"manifest": "/d/a.manifest", "world_size": 8, "rank": 3, "loader_workers": 2, '
        '"loader_worker": 1, "workers": 4, "io_backend": "threads", "memory_kind": "thp"}',
        '{"urls": "s3://b/k", "s3_endpoint": "http://127.0.0.1:9000", "s3_region": "us-east-1", '
        '"aws_access_key_id": "AKIAEXAMPLE", "aws_secret_access_key": "wJalrXUtnFEMI/K7MDENG", '
        '"aws_session_token": "IQoJb3JpZ2luX2VjEXAMPLE", "s3_path_style": true}',
        '{"urls": "a.tar", "resampled": true, "samples_per_epoch": 1000, "remainder": "drop", '
        '"drop_last": true, "epochs": 3, "resume": null}',
        '{"urls": "a.tar", "chunk_size": "8 MiB", "memory_budget": "1GB", "reads_in_flight": 8, '
        '"prefetch_batches": 4, "mlock": "auto", "hugepages": "off"}',
        '{"urls": "a.tar", "batch_size": 0}',
        '{"urls": "a.tar", "aws_secret_access_key": "only-the-secret-here"}',
        '[1, 2, 3]',
    ]):
        put("config", "config-%d" % i, c)
    for i, m in enumerate([
        "# ringfeed manifest: URL size samples (3 shards)\n/d/a.tar 10240 12\n/d/b.tar 20480 30\n"
        "s3://bucket/train/c.tar 4096 1\n",
        "# shards\n\ns3://b/a.tar 100\n  http://h/b.tar   # no size\n/d/c.tar\t7 3\n",
        "shard-{000000..000009}.tar\nx{0..6..3}\n{a,{b,c}d}\nlit\\{x\\}\n",
        "a.tar ten\n",
        "\r\na.tar 1 2 3\r\n",
    ]):
        put("manifest", "manifest-%d" % i, m)
    # Resume states: RFST, version 1, 8 words, then rounds.
    def state(words, rounds=()):
        out = b"RFST" + struct.pack("<I", 1)
        out += struct.pack("<7Q", *words) + struct.pack("<Q", len(rounds))
        for streams, batches in rounds:
            out += struct.pack("<QQ", streams, len(batches)) + struct.pack("<%dQ" % len(batches), *batches)
        return out
    put("resume", "fresh", state([0x1234, 0, 1, 0, 1, 0, 0]))
    put("resume", "mid-epoch", state([0x1234, 2, 4, 1, 2, 3, 6]))
    put("resume", "elastic", state([0x1234, 1, 2, 1, 1, 1, 2], [(2, [1, 2, 0, 1])]))
    put("resume", "hex", state([0x1234, 0, 1, 0, 1, 0, 0]).hex())
    put("resume", "bad", b"RFST\x02\x00\x00\x00")
    listing = ('<?xml version="1.0" encoding="UTF-8"?>\n'
               '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">\n'
               '  <Name>b</Name><Prefix>p/</Prefix><KeyCount>2</KeyCount><MaxKeys>2</MaxKeys>\n'
               '  <IsTruncated>true</IsTruncated>\n'
               '  <Contents><Key>p/a.tar</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified>'
               '<Size>10</Size><StorageClass>STANDARD</StorageClass></Contents>\n'
               '  <Contents><Key>p/b &amp; c.tar</Key><Size>20</Size></Contents>\n'
               '  <CommonPrefixes><Prefix>p/sub/</Prefix></CommonPrefixes>\n'
               '  <NextContinuationToken>tok/1=</NextContinuationToken>\n'
               '</ListBucketResult>')
    put("s3_xml", "list", b"\x00" + listing.encode())
    # A mounted HTTP source's listing page (parsed from the same text).
    put("s3_xml", "index-page", b"\x00<a href=\"a%20b/\">a b/</a><a href=\"../\">..</a>"
        b"<a href='c&amp;d.bin'>c</a><a href=\"?C=N\">sort</a><a href=c.bin>c</a>")
    put("s3_xml", "list-last", b"\x00<ListBucketResult><IsTruncated>false</IsTruncated><Contents>"
        b"<Key>z</Key><Size>1</Size></Contents></ListBucketResult>")
    put("s3_xml", "error", b"\x01<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>NoSuchKey"
        b"</Code><Message>The specified key does not exist.</Message><Key>a</Key></Error>")
    put("s3_xml", "sts", b"\x02" + b"""<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleWithWebIdentityResult>
    <SubjectFromWebIdentityToken>sub</SubjectFromWebIdentityToken>
    <Credentials>
      <SessionToken>TOKEN</SessionToken>
      <SecretAccessKey>SECRET</SecretAccessKey>
      <Expiration>2026-11-30T09:00:00Z</Expiration>
      <AccessKeyId>ASIAWEB</AccessKeyId>
    </Credentials>
  </AssumeRoleWithWebIdentityResult>
</AssumeRoleWithWebIdentityResponse>""")
    put("s3_xml", "sts-fields", b"\x03ASIAWEB\x002026-11-30T09:00:00Z")
    put("s3_xml", "ini", b"\x04[default]\naws_access_key_id = AKIA\nregion=us-west-2\n  s3 =\n    x = 1\n"
        b"[profile other]\n; comment\nendpoint_url = http://127.0.0.1:9000\n")

    for name, (pattern, key) in {
        "deep": ("train/**/shard-*.tar", "train/a/b/shard-000001.tar"),
        "class": ("s-[!0-3][a-z].tar", "s-9x.tar"),
        "escape": ("a\\*b/?.tar", "a*b/x.tar"),
        "dirs-none": ("**/x", "x"),
        "bad-class": ("a/[0-9", "a/1"),
        "stars": ("*a*a*a*a*a*b", "a" * 64),
    }.items():
        put("key_glob", name, pattern.encode() + b"\x00" + key.encode())


def image_seeds():
    """image_bytes: [spec selector][image]; JPEGs and PNGs of each kind the
    pipeline meets, made with Pillow (skipped with a note without it)."""
    try:
        from PIL import Image
    except ImportError:
        print("image_bytes: Pillow is not installed, no seeds written")
        return
    img = Image.new("RGB", (37, 29))
    img.putdata([((x * 7) % 256, (y * 9) % 256, (x * y) % 256) for y in range(29) for x in range(37)])

    def enc(im, fmt, **kw):
        b = io.BytesIO()
        im.save(b, fmt, **kw)
        return b.getvalue()

    base = enc(img, "JPEG", quality=80)
    kinds = {
        "jpeg": base,
        "progressive": enc(img, "JPEG", progressive=True),
        "gray-jpeg": enc(img.convert("L"), "JPEG"),
        "cmyk-jpeg": enc(img.convert("CMYK"), "JPEG"),
        "subsampled-jpeg": enc(img, "JPEG", subsampling=2),
        "truncated-jpeg": base[: len(base) // 2],
        "png": enc(img, "PNG"),
        "rgba-png": enc(img.convert("RGBA"), "PNG"),
        "gray16-png": enc(img.convert("L").convert("I;16"), "PNG"),
        "palette-png": enc(img.convert("P"), "PNG"),
        "label": b" 42\n",
    }
    for i, (name, data) in enumerate(kinds.items()):
        put("image_bytes", name, bytes([i % 6]) + data)


if __name__ == "__main__":
    image_seeds()
    tar_seeds()
    http_seeds()
    request_seeds()
    other_seeds()
