"""MNIST's IDX files (as shipped in the repository's data/mnist) as numpy arrays."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np


def _idx(path: Path) -> np.ndarray:
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[:2] != b"\0\0" or raw[2] != 0x08:
        raise ValueError(f"{path} is not an IDX file of unsigned bytes")
    dims = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims)
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{path} holds {data.size} values for dimensions {shape}")
    return data.reshape(shape)


def _file(d: Path, stem: str) -> Path:
    gz = d / f"{stem}.gz"
    return gz if gz.exists() else d / stem


def load_mnist(directory: str = "data/mnist"):
    """`(x_train, y_train, x_test, y_test)`: float32 pixels in [0, 1] (rows of 784), int64
    labels; from `{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]` in `directory`."""
    d = Path(directory)
    x = _idx(_file(d, "train-images-idx3-ubyte")).reshape(-1, 784).astype(np.float32) / 255.0
    y = _idx(_file(d, "train-labels-idx1-ubyte")).astype(np.int64)
    xt = _idx(_file(d, "t10k-images-idx3-ubyte")).reshape(-1, 784).astype(np.float32) / 255.0
    yt = _idx(_file(d, "t10k-labels-idx1-ubyte")).astype(np.int64)
    return x, y, xt, yt
