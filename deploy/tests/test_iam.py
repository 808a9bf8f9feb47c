"""deploy/iam: the IAM policy and the trust policies the guide gives
(docs/deployment.md, "Credentials"), checked against what the engine sends
and what deploy/ names.

- Each file is an IAM policy document (version 2012-10-17, statements of
  Effect, Action and Resource or Principal), every action one the engine's
  requests need (src/net/s3: ListObjectsV2, GET and HEAD, PUT and the
  multipart upload's calls), no wildcard action, and every request the
  engine makes is allowed on the prefixes the guide uses.
- The IRSA trust policy's subject is the service account deploy/ runs the
  pods as (namespace and name), its audience STS's, and its account the
  one in the service account's role ARN.
Each check has a control: a copy with that one thing wrong is refused.
"""

import copy
import json
import re
from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[1]
IAM = DEPLOY / "iam"

# The S3 calls the engine makes, and the IAM action each needs
# (https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazons3.html).
NEEDS = {
    "ListObjectsV2": "s3:ListBucket",
    "GetObject (ranged GETs, HEAD)": "s3:GetObject",
    "PutObject, CreateMultipartUpload, UploadPart, CompleteMultipartUpload": "s3:PutObject",
    "AbortMultipartUpload": "s3:AbortMultipartUpload",
}
# What the guide's recipes do, on which resource.
USES = [
    ("s3:ListBucket", "arn:aws:s3:::my-training-bucket", "datasets/train/"),
    ("s3:GetObject", "arn:aws:s3:::my-training-bucket/datasets/train/shard-000000.tar", None),
    ("s3:ListBucket", "arn:aws:s3:::my-training-bucket", "checkpoints/run-1/"),
    ("s3:PutObject", "arn:aws:s3:::my-training-bucket/checkpoints/run-1/step-1000/.metadata", None),
    ("s3:AbortMultipartUpload", "arn:aws:s3:::my-training-bucket/checkpoints/run-1/step-1000/__0_0.distcp", None),
    ("s3:GetObject", "arn:aws:s3:::my-training-bucket/checkpoints/run-1/step-1000/.metadata", None),
]
DENIED = [
    ("s3:PutObject", "arn:aws:s3:::my-training-bucket/datasets/train/shard-000000.tar", None),
    ("s3:GetObject", "arn:aws:s3:::another-bucket/datasets/x.tar", None),
    ("s3:DeleteObject", "arn:aws:s3:::my-training-bucket/checkpoints/run-1/x", None),
]


def load(name):
    return json.loads((IAM / name).read_text())


def as_list(v):
    return v if isinstance(v, list) else [v]


def glob_match(pattern, value):
    return re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), value) is not None


def allows(policy, action, resource, prefix):
    """Whether `policy` allows `action` on `resource` (with `s3:prefix` for
    a listing), as IAM evaluates the parts this policy uses."""
    for st in policy["Statement"]:
        if st["Effect"] != "Allow" or action not in as_list(st["Action"]):
            continue
        if not any(glob_match(r, resource) for r in as_list(st["Resource"])):
            continue
        cond = st.get("Condition", {}).get("StringLike", {}).get("s3:prefix")
        if cond is not None and (prefix is None or not any(glob_match(c, prefix) for c in as_list(cond))):
            continue
        return True
    return False


def check_policy(policy):
    assert policy["Version"] == "2012-10-17"
    assert set(policy) == {"Version", "Statement"}
    for st in policy["Statement"]:
        assert st["Effect"] == "Allow", st
        assert set(st) <= {"Sid", "Effect", "Action", "Resource", "Condition"}, st
        for a in as_list(st["Action"]):
            assert a in NEEDS.values(), f"{a} is not an action the engine's requests need"
        for r in as_list(st["Resource"]):
            assert r.startswith("arn:aws:s3:::"), r
    for u in USES:
        assert allows(policy, *u), f"the guide's use {u} is not allowed"
    for d in DENIED:
        assert not allows(policy, *d), f"{d} is allowed"


def test_the_policy_allows_what_the_engine_sends_and_no_more():
    policy = load("ringfeed-policy.json")
    check_policy(policy)
    # Controls: a wildcard action, a statement that lost its checkpoint
    # writes, a data prefix open to writes.
    wild = copy.deepcopy(policy)
    wild["Statement"][1]["Action"] = "s3:*"
    with pytest.raises(AssertionError, match="not an action"):
        check_policy(wild)
    short = copy.deepcopy(policy)
    short["Statement"][2]["Action"] = ["s3:GetObject"]
    with pytest.raises(AssertionError, match="not allowed"):
        check_policy(short)
    wide = copy.deepcopy(policy)
    wide["Statement"][2]["Resource"] = "arn:aws:s3:::my-training-bucket/*"
    with pytest.raises(AssertionError, match="is allowed"):
        check_policy(wide)


def service_accounts():
    out = []
    for f in DEPLOY.glob("*.yaml"):
        for d in yaml.safe_load_all(f.read_text()):
            if d and d.get("kind") == "ServiceAccount":
                out.append(d)
    return out


def check_trust(trust, accounts):
    [st] = trust["Statement"]
    assert st["Action"] == "sts:AssumeRoleWithWebIdentity"
    provider = st["Principal"]["Federated"]
    m = re.fullmatch(r"arn:aws:iam::(\d{12}):oidc-provider/(oidc\.eks\.[a-z0-9-]+\.amazonaws\.com/id/[A-Z0-9]+)", provider)
    assert m, provider
    account, issuer = m.groups()
    cond = st["Condition"]["StringEquals"]
    assert cond[f"{issuer}:aud"] == "sts.amazonaws.com"
    subjects = set(as_list(cond[f"{issuer}:sub"]))
    for sa in accounts:
        name = f"system:serviceaccount:{sa['metadata']['namespace']}:{sa['metadata']['name']}"
        assert name in subjects, f"{name} cannot assume the role"
        arn = sa["metadata"].get("annotations", {}).get("eks.amazonaws.com/role-arn", "")
        assert arn.startswith(f"arn:aws:iam::{account}:role/"), f"{arn} is not in account {account}"


def test_the_trust_policies_name_the_service_accounts_deploy_runs_as():
    accounts = service_accounts()
    assert accounts, "deploy/ has no ServiceAccount"
    trust = load("irsa-trust-policy.json")
    check_trust(trust, accounts)
    # Controls: another namespace's account, another account's role.
    other = copy.deepcopy(trust)
    cond = other["Statement"][0]["Condition"]["StringEquals"]
    for k in cond:
        if k.endswith(":sub"):
            cond[k] = "system:serviceaccount:default:ringfeed"
    with pytest.raises(AssertionError, match="cannot assume"):
        check_trust(other, accounts)
    moved = copy.deepcopy(accounts)
    moved[0]["metadata"]["annotations"]["eks.amazonaws.com/role-arn"] = "arn:aws:iam::999999999999:role/x"
    with pytest.raises(AssertionError, match="is not in account"):
        check_trust(trust, moved)
    pod_identity = load("pod-identity-trust-policy.json")
    [st] = pod_identity["Statement"]
    assert st["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert set(as_list(st["Action"])) == {"sts:AssumeRole", "sts:TagSession"}


def deployed_uses():
    """What deploy/'s pods do on S3: the engine and the trainers read the
    dataset's shards (engine.json's `urls`), the CSI driver lists and
    reads each volume's prefix and writes the write-once ones."""
    out = []
    docs = []
    for f in DEPLOY.glob("*.yaml"):
        docs += [d for d in yaml.safe_load_all(f.read_text()) if d]

    def parts(url):
        m = re.fullmatch(r"s3://([^/]+)/(.*)", url)
        assert m, url
        return m.groups()

    for d in docs:
        if d.get("kind") == "ConfigMap" and "engine.json" in d.get("data", {}):
            bucket, key = parts(json.loads(d["data"]["engine.json"])["urls"])
            prefix = key.rsplit("/", 1)[0] + "/"
            out.append(("s3:GetObject", f"arn:aws:s3:::{bucket}/{key}", None))
            out.append(("s3:ListBucket", f"arn:aws:s3:::{bucket}", prefix))
        if d.get("kind") == "PersistentVolume":
            attrs = d["spec"]["csi"]["volumeAttributes"]
            bucket, prefix = parts(attrs["source"])
            out.append(("s3:ListBucket", f"arn:aws:s3:::{bucket}", prefix))
            out.append(("s3:GetObject", f"arn:aws:s3:::{bucket}/{prefix}x", None))
            if attrs.get("access") == "write-once":
                for action in ("s3:PutObject", "s3:AbortMultipartUpload"):
                    out.append((action, f"arn:aws:s3:::{bucket}/{prefix}ckpt-rank0-step00000004.pt", None))
    return out


def test_the_policy_allows_what_deploys_pods_do():
    policy = load("ringfeed-policy.json")
    uses = deployed_uses()
    assert {a for a, _, _ in uses} == {"s3:GetObject", "s3:ListBucket", "s3:PutObject", "s3:AbortMultipartUpload"}
    for u in uses:
        assert allows(policy, *u), f"deploy/ does {u}, which the policy does not allow"
    # Control: a volume moved to a bucket the policy does not name.
    moved = [(a, r.replace("my-training-bucket", "other-bucket"), p) for a, r, p in uses]
    assert not any(allows(policy, *u) for u in moved)
