#!/usr/bin/env python3
"""boto3 reference reader, the way its users read big objects: the transfer manager.

Each object is read with ``client.download_fileobj(bucket, key, sink,
Config=TransferConfig(multipart_threshold=P, multipart_chunksize=P,
max_concurrency=N, use_threads=True))``: boto3 (s3transfer) sends a HEAD for
the size, then N threads fetch the object's P-byte parts with ranged GETs and
hand the bodies to its I/O thread, which seeks and writes them into the sink.
The sink is a seekable file-like object whose write() only counts the bytes
(seekable, so s3transfer writes each part where it belongs instead of holding
out-of-order parts in memory), so the figure is boto3's and not a disk's.

With ``--manager``, one ``s3transfer.manager.TransferManager`` (the object
download_fileobj builds for each call) takes every object's download at once
and the script waits for all of them: parts of the next object are in flight
while the last ones of the previous arrive, as in a read-ahead window.

Unsigned requests with path-style addressing, so an nginx serving a folder
whose subfolder is the bucket answers them. The client's set-up and one HEAD
per object (to check the byte count afterwards) are outside the timing;
the HEADs boto3 itself sends before each download are inside it, as they
are part of its way of reading.

Prints one JSON object, as benches/boto3_ranged.py does: bytes, seconds,
gb_per_s, cpu_seconds, cpu_s_per_gb (user + system CPU of this whole process
while reading, from resource.getrusage, every thread included), requests
(HTTP requests sent while timed: GETs, boto3's own HEADs and retries; also
split as get_requests and head_requests), and the settings.

Usage:
  boto3_transfer.py --endpoint http://127.0.0.1:18080 --bucket B KEY... \
      [--threads 8] [--part-size 8MiB] [--epochs 1] [--manager]

  --threads     max_concurrency: parts in flight (and pooled connections)
  --part-size   multipart_chunksize and multipart_threshold
  --epochs      passes over the keys
  --manager     one TransferManager for all objects instead of one
                download_fileobj call per object
"""

import json
import sys
import threading
import time

import _boto3
import boto3
import botocore
import s3transfer
from boto3.s3.transfer import TransferConfig
from s3transfer.manager import TransferManager

class DiscardSink:
    """A seekable, writable file-like object that keeps no bytes: write()
    counts them. s3transfer writes from its single I/O thread, but the lock
    keeps the count right whoever calls."""

    def __init__(self):
        self.pos = 0
        self.written = 0
        self._lock = threading.Lock()

    def write(self, data):
        n = len(data)
        with self._lock:
            self.written += n
            self.pos += n
        return n

    def seek(self, offset, whence=0):
        if whence == 0:
            self.pos = offset
        elif whence == 1:
            self.pos += offset
        else:
            raise OSError("DiscardSink has no end to seek from")
        return self.pos

    def tell(self):
        return self.pos

    def seekable(self):
        return True

    def flush(self):
        pass


class RequestCounter:
    """Counts the HTTP requests the client sends, by operation (botocore's
    before-send event fires once per attempt, retries included)."""

    def __init__(self):
        self.by_op = {}
        self._lock = threading.Lock()

    def __call__(self, event_name=None, **kwargs):
        op = event_name.rsplit(".", 1)[-1]
        with self._lock:
            self.by_op[op] = self.by_op.get(op, 0) + 1


def main():
    p = _boto3.parser(__doc__.split("\n\n")[0])
    p.add_argument("--manager", action="store_true",
                   help="one TransferManager for every object instead of one download_fileobj call each")
    p.add_argument("keys", nargs="+")
    a = p.parse_args()

    client = _boto3.client(a.endpoint, a.threads)
    transfer = TransferConfig(
        multipart_threshold=a.part_size,
        multipart_chunksize=a.part_size,
        max_concurrency=a.threads,
        use_threads=True,
    )
    sizes = {k: client.head_object(Bucket=a.bucket, Key=k)["ContentLength"] for k in a.keys}
    work = [k for _ in range(a.epochs) for k in a.keys]
    sink = DiscardSink()
    counter = RequestCounter()
    client.meta.events.register("before-send.s3", counter)

    c0, t0 = _boto3.cpu_seconds(), time.perf_counter()
    try:
        if a.manager:
            # What download_fileobj does for one object, for all of them.
            with TransferManager(client, transfer) as manager:
                futures = [manager.download(a.bucket, k, DiscardSink()) for k in work]
                for f in futures:
                    f.result()
                total = sum(f.meta.call_args.fileobj.written for f in futures)
        else:
            for k in work:
                client.download_fileobj(a.bucket, k, sink, Config=transfer)
            total = sink.written
    except Exception as e:
        print(f"boto3_transfer: {e!r}", file=sys.stderr)
        return 1
    secs, cpu = time.perf_counter() - t0, _boto3.cpu_seconds() - c0

    expected = a.epochs * sum(sizes.values())
    if total != expected:
        print(f"boto3_transfer: read {total} bytes, expected {expected}", file=sys.stderr)
        return 1
    ops = counter.by_op
    print(json.dumps({
        "bytes": total, "seconds": secs, "gb_per_s": total / secs / 1e9,
        "cpu_seconds": cpu, "cpu_s_per_gb": cpu / (total / 1e9),
        "requests": sum(ops.values()), "get_requests": ops.get("GetObject", 0),
        "head_requests": ops.get("HeadObject", 0),
        "mode": "transfer_manager" if a.manager else "download_fileobj",
        "threads": a.threads, "part_size": a.part_size, "epochs": a.epochs,
        "boto3": boto3.__version__, "botocore": botocore.__version__, "s3transfer": s3transfer.__version__,
        "python": sys.version.split()[0],
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
