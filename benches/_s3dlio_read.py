#!/usr/bin/env python3
"""s3dlio reference reader for benches/object_store.sh, as its docs show
reading objects: `get_many` of the object URIs (each object whole,
`max_in_flight` at once), the endpoint from `AWS_ENDPOINT_URL` (set by the
benchmark to the emulator) and the credentials from the environment.

    _s3dlio_read.py ENDPOINT BUCKET KEY...

Prints one JSON object: bytes, seconds, gb_per_s, cpu_s_per_gb (this
process, all threads), objects.
"""

import json
import os
import resource
import sys
import time

import s3dlio

# s3dlio's own default for get_many.
IN_FLIGHT = int(os.environ.get("S3DLIO_IN_FLIGHT", "64"))


def cpu():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def main():
    endpoint, bucket, keys = sys.argv[1], sys.argv[2], sys.argv[3:]
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    uris = [f"s3://{bucket}/{k}" for k in keys]
    c0, t0 = cpu(), time.perf_counter()
    total = 0
    for item in s3dlio.get_many(uris, max_in_flight=IN_FLIGHT):
        data = item[1] if isinstance(item, tuple) else item
        total += len(memoryview(data))
    secs, used = time.perf_counter() - t0, cpu() - c0
    print(json.dumps({"bytes": total, "seconds": secs, "gb_per_s": total / secs / 1e9,
                      "cpu_seconds": used, "cpu_s_per_gb": used / (total / 1e9),
                      "objects": len(uris), "in_flight": IN_FLIGHT}))


if __name__ == "__main__":
    sys.exit(main())
