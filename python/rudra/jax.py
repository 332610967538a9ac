"""JAX helpers: a pytree of parameters to and from Rudra's flat vector.

    from rudra.jax import save_init, Pytree
    save_init(params, "init.safetensors")            # the run's training.init
    tree = Pytree(params, "init.safetensors")
    loss_and_grad = jax.jit(jax.value_and_grad(loss_fn))

    def grad_fn(weights, batch):
        loss, grads = loss_and_grad(tree.unflatten(weights), x[batch], y[batch])
        return float(loss), tree.flatten(grads)

A leaf's name is its key path joined with dots (`{"dense": {"w": …}}` → `dense.w`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import save_init as _save_init
from ._layout import Layout


def _name(path) -> str:
    parts = []
    for key in path:
        for attr in ("key", "idx", "name"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return ".".join(parts)


def _named_leaves(params) -> tuple[list[tuple[str, object]], object]:
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    return [(_name(path), leaf) for path, leaf in leaves], treedef


def save_init(params, path: str) -> None:
    """Write the pytree `params` as the init file `path`."""
    leaves, _ = _named_leaves(params)
    _save_init(str(path), [(name, np.asarray(leaf, dtype=np.float32)) for name, leaf in leaves])


class Pytree:
    """The structure of `params`, laid out as the init file's flat vector."""

    def __init__(self, params, init: str):
        self.layout = Layout(init)
        leaves, self.treedef = _named_leaves(params)
        self.names = [name for name, _ in leaves]
        if sorted(self.names) != sorted(self.layout.names):
            raise ValueError(f"the pytree's leaves {self.names} are not the tensors of {init}: {self.layout.names}")
        self._where = {name: (shape, start, end) for name, shape, start, end in self.layout.tensors}

    def unflatten(self, weights: np.ndarray):
        """The pytree over `weights` (each leaf a `jnp` array of its slice)."""
        leaves = []
        for name in self.names:
            shape, start, end = self._where[name]
            leaves.append(jnp.asarray(weights[start:end]).reshape(shape))
        return jax.tree_util.tree_unflatten(self.treedef, leaves)

    def flatten(self, grads) -> np.ndarray:
        """A pytree of the same structure (gradients) as one float32 vector."""
        leaves, _ = _named_leaves(grads)
        return self.layout.flatten({name: np.asarray(leaf, dtype=np.float32) for name, leaf in leaves})
