#!/usr/bin/env python3
"""boto3 reference reader for benches/http_vs_curl.sh.

The way a well-tuned Python loader reads S3 objects: one boto3 client shared
by N threads, each thread taking the next fixed-size byte range of the next
object (ranged GetObject), receiving the body into its own preallocated
buffer (StreamingBody.readinto, no bytes object per read) and discarding it.
Unsigned requests with path-style addressing, so an nginx serving a folder
whose subfolder is the bucket answers them.

Prints one JSON object: bytes, seconds, gb_per_s, cpu_seconds, cpu_s_per_gb
(user + system CPU of this whole process while streaming, from
resource.getrusage, every thread included), requests. The HEADs that learn
the sizes and the client's set-up are outside the timing, as ringfeed's
HEADs and arena set-up are outside its own.

Usage:
  boto3_ranged.py --endpoint http://127.0.0.1:18080 --bucket B KEY... \
      [--threads 8] [--part-size 8MiB] [--epochs 1]
"""

import json
import sys
import threading
import time

import _boto3
import boto3
import botocore

def main():
    p = _boto3.parser(__doc__.split("\n\n")[0])
    p.add_argument("keys", nargs="+")
    a = p.parse_args()

    client = _boto3.client(a.endpoint, a.threads)
    sizes = {k: client.head_object(Bucket=a.bucket, Key=k)["ContentLength"] for k in a.keys}

    # The work list: every object's ranges in order, epoch after epoch;
    # threads take the next range, so neighbouring ranges are in flight
    # together, as in a read-ahead window.
    ranges = [(k, off, min(off + a.part_size, sizes[k]))
              for _ in range(a.epochs) for k in a.keys
              for off in range(0, sizes[k], a.part_size)]
    lock = threading.Lock()
    nxt = [0]
    got = [0] * a.threads
    errors = []

    def worker(t):
        buf = bytearray(a.part_size)
        view = memoryview(buf)
        try:
            while True:
                with lock:
                    i = nxt[0]
                    nxt[0] += 1
                if i >= len(ranges):
                    return
                key, start, end = ranges[i]
                r = client.get_object(Bucket=a.bucket, Key=key,
                                      Range=f"bytes={start}-{end - 1}")
                body, want, n = r["Body"], end - start, 0
                while n < want:
                    m = body.readinto(view[n:want])
                    if not m:
                        raise IOError(f"{key} [{start}, {end}): body ended after {n} bytes")
                    n += m
                body.close()
                got[t] += n
        except Exception as e:  # reported once, below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(a.threads)]
    c0, t0 = _boto3.cpu_seconds(), time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    secs, cpu = time.perf_counter() - t0, _boto3.cpu_seconds() - c0
    if errors:
        print(f"boto3_ranged: {len(errors)} threads failed, first: {errors[0]}", file=sys.stderr)
        return 1
    total = sum(got)
    expected = a.epochs * sum(sizes.values())
    if total != expected:
        print(f"boto3_ranged: read {total} bytes, expected {expected}", file=sys.stderr)
        return 1
    print(json.dumps({
        "bytes": total, "seconds": secs, "gb_per_s": total / secs / 1e9,
        "cpu_seconds": cpu, "cpu_s_per_gb": cpu / (total / 1e9),
        "requests": len(ranges), "threads": a.threads, "part_size": a.part_size,
        "epochs": a.epochs, "boto3": boto3.__version__, "botocore": botocore.__version__,
        "python": sys.version.split()[0],
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
