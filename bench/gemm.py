"""Single-precision GEMM with numpy, the baseline of `rudra-node bench --suite compute`.

    python3 bench/gemm.py [--size 1024] [--repeats 5]

Multiplies two random size×size float32 matrices and prints one JSON line: the median
GFLOP/s over the repeats and the BLAS library numpy calls. The thread count is the BLAS
library's own choice; set OPENBLAS_NUM_THREADS to fix it. Installs numpy with pip when it is
missing.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time


def import_numpy():
    try:
        import numpy
    except ImportError:
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "numpy"]
        if subprocess.call(pip) != 0:
            subprocess.check_call(pip + ["--break-system-packages"])
        import numpy
    return numpy


def blas_name(np):
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas['name']} {blas.get('version', '')}".strip()
    except Exception:  # numpy before 1.26 has no mode="dicts"
        return "unknown"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    np = import_numpy()
    rng = np.random.default_rng(1)
    n = args.size
    a = rng.random((n, n), dtype=np.float32)
    b = rng.random((n, n), dtype=np.float32)
    c = np.empty((n, n), dtype=np.float32)
    np.matmul(a, b, out=c)  # warm-up: thread pool, page faults
    rates = []
    for _ in range(max(args.repeats, 1)):
        start = time.perf_counter()
        np.matmul(a, b, out=c)
        rates.append(2.0 * n**3 / (time.perf_counter() - start) / 1e9)
    print(json.dumps({"gflops": statistics.median(rates), "blas": blas_name(np), "numpy": np.__version__}))


if __name__ == "__main__":
    main()
