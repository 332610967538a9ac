"""Python learners in a distributed run: the scheduler and a shard are rudra-node processes,
each learner a process of its own calling rudra.run_learner, over QUIC with mutual TLS."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import Mlp, free_port

HERE = Path(__file__).resolve().parent


def run_cluster(rudra_node, certs, tmp_path, settings, learners, rust_learners=(), interrupt=None):
    """Start a scheduler, one shard and the Python `learners` ([(name, init, extra args)]) and
    the rudra-node learners `rust_learners` (names); wait for all; the Python learners' output.
    `interrupt` = (i, seconds): Python learner i gets SIGINT that long after the start, and its
    output is its exit status and stderr."""
    port = free_port()
    addr = f"127.0.0.1:{port}"
    sets = [a for s in ["cluster.shards=1", f"cluster.learners={len(learners) + len(rust_learners)}", *settings] for a in ("--set", s)]
    common = ["--certs", str(certs), "--connect-timeout", "60s"]
    procs = [
        subprocess.Popen(
            [rudra_node, "--role", "scheduler", "--listen", addr, "--out", tmp_path / "run", *common, *sets],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        ),
        subprocess.Popen(
            [rudra_node, "--role", "shard", "--scheduler", addr, "--name", "shard-0", *common],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        ),
    ]
    procs += [
        subprocess.Popen(
            [rudra_node, "--role", "learner", "--scheduler", addr, "--name", name, *common],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        for name in rust_learners
    ]
    python = [
        subprocess.Popen(
            [sys.executable, HERE / "mlp_learner.py", addr, str(certs), name, str(init), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for name, init, extra in learners
    ]
    outputs = []
    try:
        if interrupt is not None:
            time.sleep(interrupt[1])
            python[interrupt[0]].send_signal(signal.SIGINT)
        for i, p in enumerate(python):
            out, err = p.communicate(timeout=300)
            if interrupt is not None and i == interrupt[0]:
                outputs.append({"returncode": p.returncode, "stderr": err})
                continue
            assert p.returncode == 0, err[-3000:]
            outputs.append(json.loads(out.strip().splitlines()[-1]))
        for p in procs:
            p.wait(timeout=60)
            assert p.returncode == 0, p.stderr.read().decode()[-3000:]
    finally:
        for p in procs + python:
            if p.poll() is None:
                p.kill()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    return outputs, summary


def external(tmp_path, *settings):
    Mlp(64).save(tmp_path / "init.safetensors")
    return [
        "training.model=external", "training.dataset=external", f"training.init={tmp_path / 'init.safetensors'}",
        "training.train_examples=60000", "training.batch_size=32", "training.learning_rate=0.1", *settings,
    ]


@pytest.mark.parametrize(
    "protocol",
    [
        ["protocol.kind=async", "training.epochs=2"],
        ["protocol.kind=hardsync", "training.learning_rate=0.2", "training.epochs=2"],
        ["protocol.kind=diloco", "protocol.tau=10", "training.learning_rate=0.05", "training.epochs=2"],
    ],
    ids=["async", "hardsync", "diloco"],
)
def test_two_python_learners_reach_95_percent(rudra_node, certs, tmp_path, protocol):
    settings = external(tmp_path, *protocol)
    init = tmp_path / "init.safetensors"
    learners = [("learner-0", init, []), ("learner-1", init, [])]
    outputs, summary = run_cluster(rudra_node, certs, tmp_path, settings, learners)
    for out in outputs:
        assert out["accuracy"] >= 0.95, out
        assert out["summary"] == summary, "each learner is given the run's summary.json"
    assert summary["outcome"] == "completed"
    assert summary["final_test_accuracy"] == pytest.approx(outputs[0]["accuracy"])
    if "protocol.kind=async" in protocol:
        assert summary["staleness"]["mean"] > 0, "staleness is measured and reported"


def test_a_learner_with_a_wrong_gradient_fails_alone(rudra_node, certs, tmp_path):
    settings = external(tmp_path, "protocol.kind=async", "training.epochs=1")
    init = tmp_path / "init.safetensors"
    learners = [("learner-0", init, []), ("learner-1", init, ["wrong-length"])]
    outputs, summary = run_cluster(rudra_node, certs, tmp_path, settings, learners)
    assert outputs[1]["error"].startswith("grad_fn's gradient has 50889 values; the model has 50890 parameters")
    assert outputs[0]["accuracy"] >= 0.9
    assert summary["outcome"] == "incomplete", "learner-1's examples were not processed"
    assert outputs[0]["summary"] == summary


def test_a_rust_and_a_python_learner_train_one_model(rudra_node, certs, tmp_path):
    settings = ["protocol.kind=async", "training.hidden=[64]", "training.epochs=1", "training.learning_rate=0.1"]
    learners = [("learner-1", "builtin", [])]
    outputs, summary = run_cluster(rudra_node, certs, tmp_path, settings, learners, rust_learners=["learner-0"])
    assert summary["outcome"] == "completed"
    assert summary["final_test_accuracy"] >= 0.9
    assert outputs[0]["accuracy"] == pytest.approx(summary["final_test_accuracy"], abs=1e-6)


def test_ctrl_c_stops_a_python_learner_cleanly_and_the_run_goes_on(rudra_node, certs, tmp_path):
    settings = external(tmp_path, "protocol.kind=async", "training.epochs=3")
    init = tmp_path / "init.safetensors"
    learners = [("learner-0", init, []), ("learner-1", init, [])]
    started = time.monotonic()
    outputs, summary = run_cluster(rudra_node, certs, tmp_path, settings, learners, interrupt=(1, 6.0))
    assert outputs[1]["returncode"] != 0 and "KeyboardInterrupt" in outputs[1]["stderr"], outputs[1]
    assert outputs[0]["accuracy"] >= 0.9
    assert summary["outcome"] == "incomplete", "learner-1's remaining examples were not processed"
    timeline = json.loads((tmp_path / "run" / "timeline.json").read_text())
    assert any(e["what"].startswith("learner-1") for e in timeline), timeline
    assert time.monotonic() - started < 280
