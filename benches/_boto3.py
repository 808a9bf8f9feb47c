"""What benches/boto3_ranged.py and benches/boto3_transfer.py share: their
command line, the size parser, the process CPU clock and the client (one
boto3 S3 client, unsigned, path-style, so an nginx serving a folder whose
subfolder is the bucket answers it)."""

import argparse
import resource

import boto3
from botocore import UNSIGNED
from botocore.config import Config

UNITS = {"": 1, "B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30,
         "KB": 10**3, "MB": 10**6, "GB": 10**9}


def size(text):
    t = text.strip().upper().replace(" ", "")
    num = t.rstrip("KMGIB")
    return int(float(num) * UNITS[t[len(num):]])


def cpu_seconds():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def parser(description):
    """--endpoint --bucket --threads --part-size --epochs KEY..."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--endpoint", required=True)
    p.add_argument("--bucket", required=True)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--part-size", type=size, default=8 << 20)
    p.add_argument("--epochs", type=int, default=1)
    return p


def client(endpoint, threads):
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=Config(
            signature_version=UNSIGNED,
            s3={"addressing_style": "path"},
            # One pooled keep-alive connection per thread, as boto3's own
            # TransferManager sizes its pool (max_request_concurrency);
            # botocore's default pool (10) would turn connections away above
            # 10 threads.
            max_pool_connections=threads,
            retries={"max_attempts": 3, "mode": "standard"},
        ),
    )
