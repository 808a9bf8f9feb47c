#!/usr/bin/env python3
"""s3torchconnector reference reader for benches/object_store.sh: the S3
connector for PyTorch (the AWS CRT underneath), as its users read objects,
each whole: an S3IterableDataset over the object URIs, every item's
`read()`. Path-style addressing, the region given (the CRT signs with the
credentials in the environment; the emulator does not check them).

    _s3torch_read.py ENDPOINT BUCKET KEY...

Prints one JSON object: bytes, seconds, gb_per_s, cpu_s_per_gb (this
process, all threads), objects, and the versions.
"""

import json
import resource
import sys
import time

import s3torchconnector
import torch
from s3torchconnector import S3ClientConfig, S3IterableDataset


def cpu():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def main():
    endpoint, bucket, keys = sys.argv[1], sys.argv[2], sys.argv[3:]
    uris = [f"s3://{bucket}/{k}" for k in keys]
    c0, t0 = cpu(), time.perf_counter()
    ds = S3IterableDataset.from_objects(uris, region="us-east-1", endpoint=endpoint,
                                        s3client_config=S3ClientConfig(force_path_style=True))
    total = 0
    for obj in ds:
        total += len(obj.read())
    secs, used = time.perf_counter() - t0, cpu() - c0
    print(json.dumps({"bytes": total, "seconds": secs, "gb_per_s": total / secs / 1e9,
                      "cpu_seconds": used, "cpu_s_per_gb": used / (total / 1e9),
                      "objects": len(uris), "s3torchconnector": s3torchconnector.__version__,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    sys.exit(main())
