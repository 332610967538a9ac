#!/usr/bin/env bash
# The test command: every Rust test of the workspace, then the Python package built from this
# checkout into an environment of its own (target/python-env: maturin, numpy, JAX, pytest) and
# its tests, which start rudra-node processes.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --workspace --locked
cargo build --bin rudra-node --locked

venv=target/python-env
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q --disable-pip-version-check 'maturin>=1.9,<2' numpy pytest safetensors jax
# The dev profile reuses what the tests just built, instead of a release build of everything;
# the build backend runs the environment's maturin.
PATH="$PWD/$venv/bin:$PATH" MATURIN_PEP517_ARGS="--profile dev --locked" \
    "$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps ./python
RUDRA_NODE="$PWD/target/debug/rudra-node" "$venv/bin/python" -m pytest -rs -q python/tests
