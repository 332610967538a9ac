"""A PyTorch MLP 784-256-10 trained by Rudra on the shipped MNIST; its checkpoint loads back
with `load_state_dict`.

    pip install ./python torch safetensors    # once, from the repository root
    python examples/python/torch_mlp.py       # a whole cluster in this process (async, 4 learners)

As one learner of a distributed run, add `--init init.safetensors --scheduler HOST:PORT
--certs certs --name learner-0` (docs/src/python.md).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

import rudra
from rudra.torch import TorchParams, save_init


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--init")
    ap.add_argument("--scheduler")
    ap.add_argument("--certs", default="certs")
    ap.add_argument("--name")
    ap.add_argument("--data", default="data/mnist")
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    x, y, x_test, y_test = (torch.from_numpy(a) for a in rudra.load_mnist(args.data))
    init = Path(args.init or Path(tempfile.mkdtemp()) / "init.safetensors")
    if not init.exists():
        save_init(model, str(init))
    params = TorchParams(model, str(init))

    def grad_fn(weights, batch):
        params.load(weights)
        model.zero_grad()
        index = torch.from_numpy(batch)
        loss = torch.nn.functional.cross_entropy(model(x[index]), y[index])
        loss.backward()
        return loss.item(), params.grad()

    @torch.no_grad()
    def eval_fn(weights):
        params.load(weights)
        return {"accuracy": (model(x_test).argmax(dim=1) == y_test).float().mean().item()}

    if args.scheduler:
        result = rudra.run_learner(grad_fn, scheduler=args.scheduler, certs=args.certs, name=args.name, eval_fn=eval_fn)
    else:
        out = Path(tempfile.mkdtemp()) / "run"
        settings = [
            "training.model=external", "training.dataset=external", f"training.init={init}",
            "training.train_examples=60000", "protocol.kind=async", f"training.epochs={args.epochs}",
            "training.learning_rate=0.1",
        ]
        result = rudra.local(grad_fn, set=settings, eval_fn=eval_fn, out=str(out))
        # The run's checkpoint is a state_dict.
        restored = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
        restored.load_state_dict(load_file(str(result.run_dir / "checkpoint.safetensors")))
        with torch.no_grad():
            reloaded = (restored(x_test).argmax(dim=1) == y_test).float().mean().item()
        print(f"checkpoint reloaded with load_state_dict: test accuracy {reloaded:.4f}")
    print(f"test accuracy {eval_fn(result.weights)['accuracy']:.4f}")
    assert np.isfinite(result.weights).all()


if __name__ == "__main__":
    main()
