"""An MLP 784-256-10 written in JAX, trained by Rudra on the shipped MNIST.

    pip install ./python jax                  # once, from the repository root
    python examples/python/jax_mlp.py         # a whole cluster in this process (DiLoCo, 2 learners)

As one learner of a distributed run, add `--init init.safetensors --scheduler HOST:PORT
--certs certs --name learner-0` (docs/src/python.md).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import rudra
from rudra.jax import Pytree, save_init


def init_params(key, sizes=(784, 256, 10)):
    params = {}
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        key, sub = jax.random.split(key)
        limit = np.sqrt(6 / (n_in + n_out))
        params[f"layer{i}"] = {"w": jax.random.uniform(sub, (n_in, n_out), minval=-limit, maxval=limit), "b": jnp.zeros(n_out)}
    return params


def logits(params, x):
    h = jax.nn.relu(x @ params["layer0"]["w"] + params["layer0"]["b"])
    return h @ params["layer1"]["w"] + params["layer1"]["b"]


def loss_fn(params, x, y):
    return -jnp.mean(jax.nn.log_softmax(logits(params, x))[jnp.arange(len(y)), y])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--init")
    ap.add_argument("--scheduler")
    ap.add_argument("--certs", default="certs")
    ap.add_argument("--name")
    ap.add_argument("--data", default="data/mnist")
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args()
    x, y, x_test, y_test = rudra.load_mnist(args.data)
    params = init_params(jax.random.PRNGKey(0))
    init = Path(args.init or Path(tempfile.mkdtemp()) / "init.safetensors")
    if not init.exists():
        save_init(params, str(init))
    tree = Pytree(params, str(init))
    loss_and_grad = jax.jit(jax.value_and_grad(loss_fn))
    predict = jax.jit(lambda p, xb: logits(p, xb).argmax(axis=1))

    def grad_fn(weights, batch):
        loss, grads = loss_and_grad(tree.unflatten(weights), x[batch], y[batch])
        return float(loss), tree.flatten(grads)

    def eval_fn(weights):
        return {"accuracy": float((np.asarray(predict(tree.unflatten(weights), x_test)) == y_test).mean())}

    if args.scheduler:
        result = rudra.run_learner(grad_fn, scheduler=args.scheduler, certs=args.certs, name=args.name, eval_fn=eval_fn)
    else:
        settings = [
            "training.model=external", "training.dataset=external", f"training.init={init}",
            "training.train_examples=60000", "protocol.kind=diloco", "cluster.learners=2", "cluster.shards=1",
            "training.learning_rate=0.1", f"training.epochs={args.epochs}",
        ]
        result = rudra.local(grad_fn, set=settings, eval_fn=eval_fn)
    print(f"test accuracy {eval_fn(result.weights)['accuracy']:.4f}")


if __name__ == "__main__":
    main()
