"""Rudra's Kubernetes manifests rendered for λ = 16, checked against the Kubernetes API schemas
(kubernetes-validate, strict: unknown fields are errors) and read back: names, replica counts,
the variables each node is given, probes, the learners' failure policy, and the Secrets of
`rudra-node cert secret`.

    python3 deploy/kubernetes/test.py SECRET_YAML      # needs kubernetes-validate and PyYAML

runtime/tests/kubernetes.rs runs it (installing kubernetes-validate into a virtual environment
when the system's Python lacks it).
"""

import copy
import sys
import tomllib
from pathlib import Path

import kubernetes_validate
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from render import HERE, render  # noqa: E402

LEARNERS, SHARDS = 16, 2
CONFIG = (HERE / "../../configs/default.toml").read_text()
VERSION = kubernetes_validate.latest_version()


def validate(doc):
    kubernetes_validate.validate(doc, VERSION, strict=True)


def env_of(container):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def main():
    assert tuple(int(p) for p in VERSION.split(".")[:2]) >= (1, 30), f"schemas of Kubernetes {VERSION} only"
    text = render(LEARNERS, SHARDS, "rudra-node:0.1.0", CONFIG, "10m", LEARNERS)
    docs = [d for d in yaml.safe_load_all(text) if d]
    secrets = [d for d in yaml.safe_load_all(Path(sys.argv[1]).read_text()) if d]
    for doc in docs + secrets:
        validate(doc)
    # The check can fail: a misspelt field is refused.
    bad = copy.deepcopy(docs[-1])
    bad["spec"]["paralelism"] = bad["spec"].pop("parallelism")
    try:
        validate(bad)
    except kubernetes_validate.ValidationError:
        pass
    else:
        raise AssertionError("kubernetes-validate accepted a misspelt field")

    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert sorted(by) == [
        ("ConfigMap", "rudra-run"),
        ("Job", "learner"),
        ("Service", "scheduler"),
        ("Service", "shard"),
        ("StatefulSet", "scheduler"),
        ("StatefulSet", "shard"),
    ], sorted(by)
    assert tomllib.loads(by["ConfigMap", "rudra-run"]["data"]["run.toml"]) == tomllib.loads(CONFIG)

    sched = by["StatefulSet", "scheduler"]["spec"]
    assert sched["replicas"] == 1 and sched["serviceName"] == "scheduler"
    ports = {(p["port"], p["protocol"]) for p in by["Service", "scheduler"]["spec"]["ports"]}
    assert {(7070, "UDP"), (7070, "TCP"), (9100, "TCP")} <= ports, ports
    c = sched["template"]["spec"]["containers"][0]
    e = env_of(c)
    assert e["RUDRA_ROLE"] == "scheduler" and e["RUDRA_CERTS"] == "/etc/rudra/ca"
    assert e["RUDRA__CLUSTER__LEARNERS"] == str(LEARNERS) and e["RUDRA__CLUSTER__SHARDS"] == str(SHARDS)
    assert e["RUDRA__CLUSTER__GROUPS"] == "1"  # the TOML's: no aggregators
    assert e["RUDRA_CONFIG"] == "/etc/rudra/run/run.toml" and e["RUDRA_OUT"].startswith("/var/lib/rudra/runs/")
    volumes = {v["name"]: v for v in sched["template"]["spec"]["volumes"]}
    assert volumes["ca"]["secret"]["secretName"] == "rudra-ca"
    assert volumes["run-config"]["configMap"]["name"] == "rudra-run"

    shard_svc = by["Service", "shard"]["spec"]
    assert shard_svc["clusterIP"] == "None" and shard_svc["publishNotReadyAddresses"] is True
    shard = by["StatefulSet", "shard"]["spec"]
    assert shard["replicas"] == SHARDS and shard["serviceName"] == "shard"
    assert [t["metadata"]["name"] for t in shard["volumeClaimTemplates"]] == ["checkpoints"]
    e = env_of(shard["template"]["spec"]["containers"][0])
    assert e["RUDRA_ROLE"] == "shard" and e["RUDRA_SCHEDULER"] == "scheduler:7070"
    assert e["RUDRA_ADVERTISE"] == "$(POD_NAME).shard:7171" and "RUDRA_NAME" not in e  # named by ordinal
    assert e["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert e["RUDRA_TOKEN"] == {"secretKeyRef": {"name": "rudra-join", "key": "shard-token"}}
    assert e["RUDRA_CERTS"].startswith("/var/lib/rudra/checkpoints/")  # the identity survives the pod

    job = by["Job", "learner"]["spec"]
    assert job["completionMode"] == "Indexed" and job["completions"] == job["parallelism"] == LEARNERS
    assert job["template"]["spec"]["restartPolicy"] == "Never"
    fail_job = [r for r in job["podFailurePolicy"]["rules"] if r["action"] == "FailJob"]
    assert fail_job and sorted(fail_job[0]["onExitCodes"]["values"]) == [2, 3]
    assert fail_job[0]["onExitCodes"]["operator"] == "In"
    e = env_of(job["template"]["spec"]["containers"][0])
    assert e["RUDRA_ROLE"] == "learner" and e["RUDRA_SCHEDULER"] == "scheduler:7070"
    assert e["RUDRA_TOKEN"] == {"secretKeyRef": {"name": "rudra-join", "key": "learner-token"}}
    assert "RUDRA_NAME" not in e  # JOB_COMPLETION_INDEX names each learner

    for kind, name in [("StatefulSet", "scheduler"), ("StatefulSet", "shard"), ("Job", "learner")]:
        spec = by[kind, name]["spec"]["template"]["spec"]
        c = spec["containers"][0]
        assert c["image"] == "rudra-node:0.1.0"
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz", name
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz", name
        assert env_of(c)["RUDRA_METRICS_ADDR"] == "0.0.0.0:9100", name
        assert spec["securityContext"]["runAsNonRoot"] is True, name

    secret_names = {s["metadata"]["name"]: s["stringData"] for s in secrets}
    assert sorted(secret_names) == ["rudra-ca", "rudra-join"], sorted(secret_names)
    assert sorted(secret_names["rudra-ca"]) == ["ca.key", "ca.pem"]
    assert sorted(secret_names["rudra-join"]) == ["aggregator-token", "ca.pem", "learner-token", "shard-token"]
    assert "PRIVATE KEY" not in "".join(secret_names["rudra-join"].values())
    # With 4 learner groups: an aggregator per group, each group's learners reaching it by name.
    grouped = [d for d in yaml.safe_load_all(render(LEARNERS, SHARDS, "rudra-node:0.1.0", CONFIG, "10m", LEARNERS, 4)) if d]
    for doc in grouped:
        validate(doc)
    by = {(d["kind"], d["metadata"]["name"]): d for d in grouped}
    assert ("Service", "aggregator") in by and by["Service", "aggregator"]["spec"]["clusterIP"] == "None"
    agg = by["StatefulSet", "aggregator"]["spec"]
    assert agg["replicas"] == 4 and agg["serviceName"] == "aggregator"
    e = env_of(agg["template"]["spec"]["containers"][0])
    assert e["RUDRA_ROLE"] == "aggregator" and e["RUDRA_ADVERTISE"] == "$(POD_NAME).aggregator:7272"
    assert e["RUDRA_TOKEN"] == {"secretKeyRef": {"name": "rudra-join", "key": "aggregator-token"}}
    assert env_of(by["StatefulSet", "scheduler"]["spec"]["template"]["spec"]["containers"][0])["RUDRA__CLUSTER__GROUPS"] == "4"
    print(f"{len(docs)} manifests for λ = {LEARNERS} (and {len(grouped)} with 4 learner groups) and 2 Secrets valid against Kubernetes {VERSION}")


if __name__ == "__main__":
    main()
