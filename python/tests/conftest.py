"""Shared fixtures: the shipped MNIST as numpy arrays, a numpy MLP, and the rudra-node binary."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import rudra

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def mnist():
    """(x_train, y_train, x_test, y_test) of the shipped MNIST."""
    return rudra.load_mnist(str(ROOT / "data" / "mnist"))


class Mlp:
    """A 784-h-10 ReLU MLP in numpy, its weights views of Rudra's flat vector."""

    def __init__(self, hidden: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        limit1, limit2 = np.sqrt(6 / (784 + hidden)), np.sqrt(6 / (hidden + 10))
        self.init = {
            "l1.w": rng.uniform(-limit1, limit1, (784, hidden)).astype(np.float32),
            "l1.b": np.zeros(hidden, np.float32),
            "l2.w": rng.uniform(-limit2, limit2, (hidden, 10)).astype(np.float32),
            "l2.b": np.zeros(10, np.float32),
        }

    def save(self, path: Path) -> rudra.Layout:
        rudra.save_init(str(path), list(self.init.items()))
        return rudra.Layout(str(path))

    @staticmethod
    def logits(p, x):
        h = np.maximum(x @ p["l1.w"] + p["l1.b"], 0.0)
        return h, h @ p["l2.w"] + p["l2.b"]

    @classmethod
    def loss_and_grads(cls, p, x, y):
        h, z = cls.logits(p, x)
        z = z - z.max(axis=1, keepdims=True)
        e = np.exp(z)
        prob = e / e.sum(axis=1, keepdims=True)
        n = len(y)
        loss = float(-np.log(prob[np.arange(n), y] + 1e-12).mean())
        dz = prob
        dz[np.arange(n), y] -= 1.0
        dz /= n
        dh = (dz @ p["l2.w"].T) * (h > 0)
        grads = {"l2.w": h.T @ dz, "l2.b": dz.sum(0), "l1.w": x.T @ dh, "l1.b": dh.sum(0)}
        return loss, grads

    @classmethod
    def accuracy(cls, p, x, y) -> float:
        return float((cls.logits(p, x)[1].argmax(axis=1) == y).mean())


def mlp_functions(layout: rudra.Layout, data):
    """grad_fn and eval_fn of the MLP over `data`, for Rudra."""
    x, y, xt, yt = data

    def grad_fn(weights, batch):
        loss, grads = Mlp.loss_and_grads(layout.views(weights), x[batch], y[batch])
        return loss, layout.flatten(grads)

    def eval_fn(weights):
        p = layout.views(weights)
        return {"accuracy": Mlp.accuracy(p, xt, yt)}

    return grad_fn, eval_fn


@pytest.fixture(scope="session")
def rudra_node() -> Path:
    """The rudra-node binary (RUDRA_NODE, else the workspace's debug build)."""
    path = Path(os.environ.get("RUDRA_NODE", ROOT / "target" / "debug" / "rudra-node"))
    if not path.exists():
        pytest.skip(f"no rudra-node at {path}: build it (cargo build --bin rudra-node) or set RUDRA_NODE")
    return path


@pytest.fixture(scope="session")
def certs(rudra_node, tmp_path_factory) -> Path:
    """A CA and certificates for a scheduler, two shards and four learners."""
    d = tmp_path_factory.mktemp("certs")
    subprocess.run([rudra_node, "cert", "init", "--dir", d], check=True, capture_output=True)
    names = ["scheduler", "shard-0", "shard-1"] + [f"learner-{i}" for i in range(4)]
    for name in names:
        subprocess.run([rudra_node, "cert", "issue", "--dir", d, "--name", name], check=True, capture_output=True)
    return d


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
