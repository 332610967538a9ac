"""Rudra from Python: train the model you already have on Rudra's parameter server.

Only the gradient comes from your framework. Rudra keeps everything else: the sharded
parameters, the protocols (hardsync, softsync, async with staleness-dependent rates and a
staleness bound; EASGD, EAMSGD, DOWNPOUR, MDOWNPOUR; DiLoCo), the local optimizers, the
staleness tracking, QUIC with mutual TLS, and failover.

    import numpy as np, rudra

    def grad_fn(weights: np.ndarray, batch: np.ndarray) -> tuple[float, np.ndarray]:
        # weights: the flat float32 parameters, a read-only view (no copy);
        # batch: int64 indices of this step's examples in your dataset.
        ...
        return loss, gradient  # a float and a float32 array of len(weights)

    result = rudra.run_learner(grad_fn, scheduler="HOST:PORT", certs="certs", name="learner-0")
    result.weights   # the run's final weights
    result.summary   # the run's summary.json, as a dict

`rudra.local(grad_fn, config=...)` runs a whole cluster in this process. The run's
configuration names the model and its data (`training.model = "external"`,
`training.dataset = "external"`, `training.init`, `training.train_examples`); `Layout` and the
`rudra.torch` and `rudra.jax` helpers map between your parameters and the flat vector.
"""

from ._layout import Layout
from ._mnist import load_mnist
from ._rudra import RunResult, __version__, init_layout, local, run_learner, save_init

__all__ = ["Layout", "RunResult", "__version__", "init_layout", "load_mnist", "local", "run_learner", "save_init"]
