"""Read a Rudra checkpoint.safetensors with the safetensors package and numpy, as another
tool would, and print what it holds as JSON: the metadata, and per tensor its dtype, shape,
first three and last values, and float64 sum.

    python3 runtime/tests/read_checkpoint.py RUN_DIR/checkpoint.safetensors
"""

import json
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file

path = sys.argv[1]
tensors = load_file(path)
with safe_open(path, framework="numpy") as f:
    metadata = f.metadata()
print(json.dumps({
    "metadata": metadata,
    "tensors": {
        name: {
            "dtype": str(t.dtype),
            "shape": list(t.shape),
            "first": [float(v) for v in t.reshape(-1)[:3]],
            "last": float(t.reshape(-1)[-1]),
            "sum": float(t.astype(np.float64).sum()),
        }
        for name, t in tensors.items()
    },
}))
