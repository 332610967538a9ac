"""One Python learner of a distributed run: a numpy MLP on MNIST (the test's own model).

    python mlp_learner.py SCHEDULER CERTS NAME INIT|builtin [wrong-length]

Prints the test accuracy of the run's final weights, computed here, as JSON.
"""

from __future__ import annotations

import json
import sys

import numpy as np

import rudra

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from conftest import ROOT, Mlp, mlp_functions  # noqa: E402


class BuiltinLayout:
    """The flat layout of Rudra's built-in mlp 784-h-10: fc1.weight [h, 784], fc1.bias,
    fc2.weight [10, h], fc2.bias, in that order; as the test's MLP's tensors."""

    def __init__(self, hidden: int):
        self.h = hidden
        self.size = hidden * 784 + hidden + 10 * hidden + 10

    def views(self, flat):
        h, o = self.h, 0
        w1 = flat[o : o + h * 784].reshape(h, 784).T
        o += h * 784
        b1 = flat[o : o + h]
        o += h
        w2 = flat[o : o + 10 * h].reshape(10, h).T
        o += 10 * h
        return {"l1.w": w1, "l1.b": b1, "l2.w": w2, "l2.b": flat[o : o + 10]}

    def flatten(self, g):
        parts = [g["l1.w"].T.reshape(-1), g["l1.b"], g["l2.w"].T.reshape(-1), g["l2.b"]]
        return np.concatenate(parts).astype(np.float32)


def main() -> None:
    scheduler, certs, name, init = sys.argv[1:5]
    wrong = len(sys.argv) > 5
    x, y, xt, yt = rudra.load_mnist(str(ROOT / "data" / "mnist"))
    layout = BuiltinLayout(64) if init == "builtin" else rudra.Layout(init)
    grad_fn, eval_fn = mlp_functions(layout, (x, y, xt, yt))
    if wrong:
        def grad_fn(weights, batch):  # noqa: F811
            return 1.0, np.zeros(len(weights) - 1, np.float32)
    try:
        result = rudra.run_learner(grad_fn, scheduler=scheduler, certs=certs, name=name, eval_fn=eval_fn)
    except ValueError as e:
        print(json.dumps({"error": str(e)}))
        return
    accuracy = Mlp.accuracy(layout.views(result.weights), xt, yt)
    print(json.dumps({"accuracy": accuracy, "summary": result.summary}))


if __name__ == "__main__":
    main()
