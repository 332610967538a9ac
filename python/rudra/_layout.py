"""The flat parameter vector and your named tensors, by the layout of an init file."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ._rudra import init_layout


class Layout:
    """The tensors of an init file in file order, which is the order of the flat vector."""

    def __init__(self, init: str):
        self.tensors = [(name, tuple(shape), start, end) for name, shape, start, end in init_layout(str(init))]
        self.size = self.tensors[-1][3] if self.tensors else 0

    @property
    def names(self) -> list[str]:
        return [name for name, _, _, _ in self.tensors]

    def views(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """Each tensor as a view of `flat` (no copies), by name."""
        if flat.shape != (self.size,):
            raise ValueError(f"a flat vector of {flat.shape} for a layout of {self.size} parameters")
        return {name: flat[start:end].reshape(shape) for name, shape, start, end in self.tensors}

    def flatten(self, tensors: Mapping[str, np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        """`tensors` (every name of the layout, of its shape) as one float32 vector."""
        flat = np.empty(self.size, dtype=np.float32) if out is None else out
        for name, shape, start, end in self.tensors:
            if name not in tensors:
                raise KeyError(f"no tensor {name!r}, which the layout has")
            value = np.asarray(tensors[name])
            if value.shape != shape:
                raise ValueError(f"tensor {name!r} is {value.shape}; the layout has {shape}")
            flat[start:end] = value.reshape(-1)
        return flat
