"""Render Rudra's Kubernetes manifests for a cluster size, as one file for `kubectl apply -f`.

    python3 deploy/kubernetes/render.py --learners 16 [--shards 2] [--groups G] [--image rudra-node:latest]
        [--config configs/default.toml] [--connect-timeout 10m] [--backoff-limit N] > rudra.yaml

The templates beside this script (config.yaml, scheduler.yaml, shards.yaml, aggregators.yaml,
learners.yaml) hold ${NAME} placeholders: the run's TOML goes into the ConfigMap, λ into the
learners' Job (completions = parallelism = λ) and the scheduler's RUDRA__CLUSTER__LEARNERS, the
shard count into the shards' replicas and RUDRA__CLUSTER__SHARDS, the learner groups (default:
the TOML's cluster.groups) into RUDRA__CLUSTER__GROUPS and, with more than one, the
aggregators' replicas. The Secrets come from `rudra-node cert secret`.
"""

import argparse
import re
import string
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATES = ["config.yaml", "scheduler.yaml", "shards.yaml", "aggregators.yaml", "learners.yaml"]


def render(learners, shards, image, config_text, connect_timeout, backoff_limit, groups=None):
    if groups is None:
        groups = tomllib.loads(config_text).get("cluster", {}).get("groups", 1)
    values = {
        "LEARNERS": str(learners),
        "SHARDS": str(shards),
        "GROUPS": str(groups),
        "IMAGE": image,
        "CONNECT_TIMEOUT": connect_timeout,
        "BACKOFF_LIMIT": str(backoff_limit),
    }
    docs = []
    # Each group beyond one has an aggregator.
    for name in (t for t in TEMPLATES if groups > 1 or t != "aggregators.yaml"):
        text = string.Template((HERE / name).read_text()).safe_substitute(values)
        # The TOML last, as it is: a `$` in it is not a placeholder.
        toml = "".join(f"    {line}\n" if line else "\n" for line in config_text.rstrip().split("\n"))
        text = text.replace("${RUN_TOML}\n", toml)
        left = re.findall(r"\$\{\w+\}", text)
        if left:
            raise SystemExit(f"{name}: no value for {', '.join(sorted(set(left)))}")
        docs.append(text.strip() + "\n")
    return "---\n".join(docs)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--learners", type=int, default=4, help="λ: the Job's parallelism (default 4)")
    p.add_argument("--shards", type=int, default=2, help="shard replicas (default 2)")
    p.add_argument("--groups", type=int, help="learner groups, each beyond one an aggregator (default: the TOML's)")
    p.add_argument("--image", default="rudra-node:latest")
    p.add_argument("--config", type=Path, default=HERE / "../../configs/default.toml", help="the run's TOML")
    p.add_argument("--connect-timeout", default="10m", help="how long nodes wait for each other")
    p.add_argument("--backoff-limit", type=int, help="learner pods that may fail in all (default λ)")
    a = p.parse_args()
    if a.learners < 1 or a.shards < 1 or (a.groups is not None and not 1 <= a.groups <= a.learners):
        raise SystemExit("--learners and --shards must be at least 1, --groups from 1 to --learners")
    limit = a.learners if a.backoff_limit is None else a.backoff_limit
    text = render(a.learners, a.shards, a.image, a.config.read_text(), a.connect_timeout, limit, a.groups)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
