"""PyTorch helpers: a module's parameters to and from Rudra's flat vector.

    from rudra.torch import save_init, TorchParams
    save_init(model, "init.safetensors")            # the run's training.init
    params = TorchParams(model, "init.safetensors")

    def grad_fn(weights, batch):
        params.load(weights)                          # the parameters become views of weights
        model.zero_grad()
        loss = loss_fn(model(x[batch]), y[batch])
        loss.backward()
        return loss.item(), params.grad()             # gathered in the flat vector's order

A checkpoint of the run loads back with
`model.load_state_dict(safetensors.torch.load_file(".../checkpoint.safetensors"))`.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from . import save_init as _save_init
from ._layout import Layout


def save_init(module: torch.nn.Module, path: str) -> None:
    """Write `module`'s parameters (its `state_dict`, float tensors) as the init file `path`."""
    tensors = [
        (name, t.detach().cpu().to(torch.float32).contiguous().numpy())
        for name, t in module.state_dict().items()
        if t.is_floating_point()
    ]
    _save_init(str(path), tensors)


class TorchParams:
    """`module`'s parameters in the order of the init file's layout."""

    def __init__(self, module: torch.nn.Module, init: str):
        self.layout = Layout(init)
        named = dict(module.named_parameters())
        missing = [n for n in self.layout.names if n not in named]
        extra = [n for n in named if n not in self.layout.names]
        if missing or extra:
            raise ValueError(f"the module and {init} differ: missing {missing}, not in the file {extra}")
        self.params = [named[n] for n in self.layout.names]

    def load(self, weights: np.ndarray) -> None:
        """Make every parameter a view of `weights` (read-only, so torch warns; nothing
        writes it: gradients go to `.grad`)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.from_numpy(weights)
        for p, (_, shape, start, end) in zip(self.params, self.layout.tensors):
            p.data = flat[start:end].view(shape)

    def grad(self) -> np.ndarray:
        """The parameters' gradients as one float32 vector in the layout's order."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        return torch.cat([g.reshape(-1) for g in grads]).to(torch.float32).numpy()
