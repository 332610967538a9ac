"""An MLP 784-256-10 on the shipped MNIST, its gradients computed in numpy, trained by Rudra.

    pip install ./python                      # once, from the repository root
    python examples/python/numpy_mlp.py       # a whole cluster in this process (async, 4 learners)

As one learner of a distributed run (the scheduler and shards are rudra-node processes whose
configuration names the same init file; docs/src/python.md has the commands):

    python examples/python/numpy_mlp.py --init init.safetensors --scheduler 127.0.0.1:7070 \\
        --certs certs --name learner-0
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

import rudra

HIDDEN = 256


def init_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    """Glorot-uniform weights, zero biases."""
    rng = np.random.default_rng(seed)
    a1, a2 = np.sqrt(6 / (784 + HIDDEN)), np.sqrt(6 / (HIDDEN + 10))
    return {
        "fc1.weight": rng.uniform(-a1, a1, (HIDDEN, 784)).astype(np.float32),
        "fc1.bias": np.zeros(HIDDEN, np.float32),
        "fc2.weight": rng.uniform(-a2, a2, (10, HIDDEN)).astype(np.float32),
        "fc2.bias": np.zeros(10, np.float32),
    }


def forward(p, x):
    """Hidden activations and logits, one column per example: `W @ x.T` is the faster product
    for BLAS at these shapes than `x @ W.T`."""
    h = p["fc1.weight"] @ x.T
    h += p["fc1.bias"][:, None]
    np.maximum(h, 0.0, out=h)
    return h, p["fc2.weight"] @ h + p["fc2.bias"][:, None]


def functions(layout: rudra.Layout, data):
    x, y, x_test, y_test = data
    grad = np.empty(layout.size, np.float32)
    g = layout.views(grad)  # the gradient's tensors are views of one flat buffer

    def grad_fn(weights, batch):
        p = layout.views(weights)
        xb, yb = x[batch], y[batch]
        h, z = forward(p, xb)
        z -= z.max(axis=0)
        prob = np.exp(z)
        prob /= prob.sum(axis=0)
        cols = np.arange(len(yb))
        loss = float(-np.log(prob[yb, cols] + 1e-12).mean())
        prob[yb, cols] -= 1.0
        dz = prob / len(yb)
        np.matmul(dz, h.T, out=g["fc2.weight"])
        dz.sum(axis=1, out=g["fc2.bias"])
        dh = p["fc2.weight"].T @ dz
        dh *= h > 0
        np.matmul(dh, xb, out=g["fc1.weight"])
        dh.sum(axis=1, out=g["fc1.bias"])
        return loss, grad

    def eval_fn(weights):
        p = layout.views(weights)
        return {"accuracy": float((forward(p, x_test)[1].argmax(axis=0) == y_test).mean())}

    return grad_fn, eval_fn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--init", help="the init file (written if missing); default: a temporary one")
    ap.add_argument("--scheduler", help="HOST:PORT: run one learner of that cluster")
    ap.add_argument("--certs", default="certs")
    ap.add_argument("--name")
    ap.add_argument("--data", default="data/mnist")
    ap.add_argument("--protocol", default="async")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--write-only", action="store_true", help="write the init file (--init) and exit")
    args = ap.parse_args()
    init = Path(args.init or Path(tempfile.mkdtemp()) / "init.safetensors")
    if not init.exists():
        rudra.save_init(str(init), list(init_tensors().items()))
    if args.write_only:
        return
    layout = rudra.Layout(str(init))
    grad_fn, eval_fn = functions(layout, rudra.load_mnist(args.data))
    if args.scheduler:
        result = rudra.run_learner(grad_fn, scheduler=args.scheduler, certs=args.certs, name=args.name, eval_fn=eval_fn)
    else:
        settings = [
            "training.model=external", "training.dataset=external", f"training.init={init}",
            "training.train_examples=60000", f"protocol.kind={args.protocol}", f"training.epochs={args.epochs}",
            "training.learning_rate=0.1",
        ]
        result = rudra.local(grad_fn, set=settings, eval_fn=eval_fn)
    print(f"test accuracy {eval_fn(result.weights)['accuracy']:.4f}")


if __name__ == "__main__":
    main()
