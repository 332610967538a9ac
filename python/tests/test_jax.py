"""A JAX model through rudra.local, with the rudra.jax helpers."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed")
import jax.numpy as jnp  # noqa: E402

import rudra  # noqa: E402
from rudra.jax import Pytree, save_init  # noqa: E402


def test_a_jax_softmax_regression_learns_mnist_under_diloco(tmp_path, mnist):
    x, y, xt, yt = mnist
    params = {"dense": {"w": jnp.zeros((784, 10)), "b": jnp.zeros(10)}}
    save_init(params, tmp_path / "init.safetensors")
    tree = Pytree(params, tmp_path / "init.safetensors")

    def loss_fn(p, xb, yb):
        logits = xb @ p["dense"]["w"] + p["dense"]["b"]
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(len(yb)), yb])

    loss_and_grad = jax.jit(jax.value_and_grad(loss_fn))

    def grad_fn(weights, batch):
        loss, grads = loss_and_grad(tree.unflatten(weights), x[batch], y[batch])
        return float(loss), tree.flatten(grads)

    def eval_fn(weights):
        p = tree.unflatten(weights)
        predicted = np.asarray((xt @ p["dense"]["w"] + p["dense"]["b"]).argmax(axis=1))
        return {"accuracy": float((predicted == yt).mean())}

    settings = [
        "training.model=external", "training.dataset=external",
        f"training.init={tmp_path / 'init.safetensors'}", "training.train_examples=60000",
        "protocol.kind=diloco", "cluster.learners=2", "cluster.shards=1",
        "training.batch_size=64", "training.learning_rate=0.1", "training.epochs=1",
    ]
    result = rudra.local(grad_fn, set=settings, eval_fn=eval_fn)
    assert result.summary["final_test_accuracy"] >= 0.85
    assert eval_fn(result.weights)["accuracy"] == pytest.approx(result.summary["final_test_accuracy"])
