"""The peers' workload (MLP 784-256-10 on the shipped MNIST, async, one shard) with Rust learners
and with numpy Python learners, in the same cluster setup: one process per role, loopback QUIC
with mutual TLS. Runs alternate; the table gives medians, their ratio, where a learner's step
goes (computing its gradient, and the rest: waiting for weights, the network, the CPU), and the
binding's cost per step.

    pip install ./python                      # a release build (what users get)
    cargo build --release --bin rudra-node
    python python/benches/learners.py --repeats 3 --learners 2 --epochs 1 [--set protocol.prefetch=1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import rudra

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "python" / "numpy_mlp.py"


def cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def certs(node: Path, d: Path, learners: int) -> None:
    subprocess.run([node, "cert", "init", "--dir", d], check=True, capture_output=True)
    for name in ["scheduler", "shard-0"] + [f"learner-{i}" for i in range(learners)]:
        subprocess.run([node, "cert", "issue", "--dir", d, "--name", name], check=True, capture_output=True)


def run(node: Path, d: Path, port: int, learners: int, settings: list[str], python_init: Path | None) -> dict:
    """One run: its summary.json."""
    addr = f"127.0.0.1:{port}"
    out = d / f"run-{port}"
    common = ["--certs", str(d / "certs"), "--connect-timeout", "60s"]
    sets = [a for s in settings for a in ("--set", s)]
    procs = [
        subprocess.Popen([node, "--role", "scheduler", "--listen", addr, "--out", out, *common, *sets]),
        subprocess.Popen([node, "--role", "shard", "--scheduler", addr, "--name", "shard-0", *common]),
    ]
    for i in range(learners):
        name = f"learner-{i}"
        if python_init is None:
            cmd = [node, "--role", "learner", "--scheduler", addr, "--name", name, *common]
        else:
            cmd = [sys.executable, EXAMPLE, "--init", python_init, "--scheduler", addr, "--certs", d / "certs", "--name", name]
        # One BLAS thread per learner process, as one Rust learner computes on one thread:
        # idle BLAS threads spin, and take the cores the other processes need.
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=env))
    for p in procs:
        if p.wait(timeout=1800) != 0:
            raise SystemExit(f"{p.args[0]} exited {p.returncode}")
    return json.loads((out / "summary.json").read_text())


def per_step_ms(summary: dict, key: str) -> float:
    """A learner's `key` seconds (compute or wait) per gradient step, in milliseconds."""
    return 1e3 * sum(t[key] for t in summary["learner_time"]) / max(summary["bytes"]["steps"], 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rudra-node", default=str(ROOT / "target" / "release" / "rudra-node"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--learners", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a setting for both kinds of run, e.g. protocol.prefetch=1")
    args = ap.parse_args()
    node = Path(args.rudra_node)
    d = Path(tempfile.mkdtemp(prefix="rudra-bench-"))
    (d / "certs").mkdir()
    certs(node, d / "certs", args.learners)
    init = d / "init.safetensors"
    subprocess.run([sys.executable, EXAMPLE, "--init", init, "--write-only"], check=True)
    common = [
        "protocol.kind=async", "cluster.shards=1", f"cluster.learners={args.learners}",
        f"training.epochs={args.epochs}", "training.batch_size=32", "training.learning_rate=0.1",
        "training.evals_per_epoch=1", *args.set,
    ]
    rust = common + ["training.model=mlp", "training.hidden=[256]"]
    python = common + [
        "training.model=external", "training.dataset=external", f"training.init={init}",
        "training.train_examples=60000",
    ]
    runs = {"rust": [], "python": []}
    port = 27070
    for r in range(args.repeats):
        for kind, settings, py_init in (("rust", rust, None), ("python", python, init)):
            port += 1
            runs[kind].append(run(node, d, port, args.learners, settings, py_init))
            print(f"repeat {r + 1}: {kind} {runs[kind][-1]['samples_per_second']:.0f} samples/s", file=sys.stderr)
    params = rudra.Layout(str(init)).size
    grad = np.zeros(params, np.float32)
    started = time.perf_counter()
    for _ in range(2000):
        (lambda w, b: (0.0, grad))(grad, None)
    inside = (time.perf_counter() - started) / 2000
    per_call = rudra._rudra._binding_cost(lambda w, b: (0.0, grad), params, 32, 2000)
    median = lambda kind, f: statistics.median(f(s) for s in runs[kind])  # noqa: E731
    rate = lambda kind: median(kind, lambda s: s["samples_per_second"])  # noqa: E731
    extra = f", {', '.join(args.set)}" if args.set else ""
    print(f"CPU: {cpu()}, {len(runs['rust'])} runs each, λ = {args.learners}, μ = 32, {params} parameters{extra}")
    print("| learners | samples/s (median) | ratio | computing, ms/step | the rest, ms/step |")
    print("|---|---|---|---|---|")
    for kind, name in (("rust", "Rust (rudra-node)"), ("python", "Python (numpy)")):
        compute = median(kind, lambda s: per_step_ms(s, "compute_seconds"))
        rest = median(kind, lambda s: per_step_ms(s, "wait_seconds"))
        print(f"| {name} | {rate(kind):.0f} | {rate(kind) / rate('rust'):.2f} | {compute:.3f} | {rest:.3f} |")
    print(f"binding cost per step: {(per_call - inside) * 1e6:.1f} µs (a call through it {per_call * 1e6:.1f} µs, "
          f"the function alone {inside * 1e6:.2f} µs)")


if __name__ == "__main__":
    main()
