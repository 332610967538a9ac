"""Whole clusters in this process (`rudra.local`) with gradients from Python."""

from __future__ import annotations

import numpy as np
import pytest

import rudra

from conftest import Mlp, mlp_functions


def external(init, examples: int, *settings: str) -> list[str]:
    return [
        "training.model=external",
        "training.dataset=external",
        f"training.init={init}",
        f"training.train_examples={examples}",
        *settings,
    ]


def test_hardsync_applies_the_mean_gradient_of_every_round(tmp_path):
    # ½|w − c|² whatever the batch: each hardsync round moves w by α (w − c), the mean of λ
    # identical gradients, so after k updates w = c + (1 − α)^k (w0 − c).
    c = np.linspace(-1.0, 1.0, 10, dtype=np.float32)
    w0 = np.full(10, 3.0, dtype=np.float32)
    rudra.save_init(str(tmp_path / "init.safetensors"), [("w", w0)])
    seen = []

    def grad_fn(weights, batch):
        assert not weights.flags.writeable, "the weights are a read-only view"
        seen.append(len(batch))
        d = weights - c
        return float(0.5 * d @ d), d.astype(np.float32)

    settings = external(
        tmp_path / "init.safetensors", 64,
        "protocol.kind=hardsync", "cluster.learners=2", "cluster.shards=1",
        "training.batch_size=8", "training.learning_rate=0.1", "training.epochs=1",
    )
    result = rudra.local(grad_fn, set=settings)
    assert set(seen) == {8}, "every batch holds μ indices"
    updates = result.summary["updates"]
    assert updates == 4, "64 examples, 2 learners of 32, μ = 8: four rounds"
    np.testing.assert_allclose(result.weights, c + 0.9**updates * (w0 - c), rtol=1e-5)
    assert result.summary["final_test_accuracy"] is None, "no eval_fn, nothing measured"


def test_a_numpy_mlp_learns_mnist_under_async(tmp_path, mnist):
    layout = Mlp(64).save(tmp_path / "init.safetensors")
    grad_fn, eval_fn = mlp_functions(layout, mnist)
    settings = external(
        tmp_path / "init.safetensors", 60000,
        "protocol.kind=async", "cluster.learners=2", "cluster.shards=2",
        "training.batch_size=32", "training.learning_rate=0.1", "training.epochs=1",
    )
    result = rudra.local(grad_fn, set=settings, eval_fn=eval_fn, out=str(tmp_path / "run"))
    accuracy = Mlp.accuracy(layout.views(result.weights), mnist[2], mnist[3])
    assert accuracy >= 0.9
    assert result.summary["final_test_accuracy"] == pytest.approx(accuracy)
    assert result.summary["staleness"]["mean"] > 0, "async: gradients computed on older weights"
    assert (result.run_dir / "checkpoint.safetensors").exists()
    # The checkpoint keeps the init file's names and shapes.
    safetensors = pytest.importorskip("safetensors.numpy")
    saved = safetensors.load_file(str(result.run_dir / "checkpoint.safetensors"))
    assert {k: v.shape for k, v in saved.items()} == {k: v.shape for k, v in Mlp(64).init.items()}
    np.testing.assert_array_equal(layout.flatten(saved), result.weights)


def test_a_gradient_of_the_wrong_length_raises_naming_it(tmp_path):
    rudra.save_init(str(tmp_path / "init.safetensors"), [("w", np.zeros(10, np.float32))])

    def grad_fn(weights, batch):
        return 1.0, np.zeros(5, np.float32)

    settings = external(tmp_path / "init.safetensors", 64, "protocol.kind=async", "cluster.learners=2", "cluster.shards=1")
    with pytest.raises(ValueError, match="gradient has 5 values; the model has 10 parameters"):
        rudra.local(grad_fn, set=settings)


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        (lambda w: (1.0, np.zeros(len(w), np.float64)), "float64"),
        (lambda w: (1.0, np.full(len(w), np.nan, np.float32)), "holds NaN at 0"),
        (lambda w: (1.0, np.where(np.arange(len(w)) == 9000, np.inf, 0).astype(np.float32)), "holds inf at 9000"),
        (lambda w: (float("inf"), np.zeros(len(w), np.float32)), "loss is inf"),
        (lambda w: np.zeros(len(w), np.float32), "must return \\(loss, gradient\\)"),
    ],
)
def test_unusable_results_raise_naming_what_is_wrong(tmp_path, returned, message):
    rudra.save_init(str(tmp_path / "init.safetensors"), [("w", np.zeros(10_000, np.float32))])
    settings = external(tmp_path / "init.safetensors", 64, "protocol.kind=async", "cluster.learners=1", "cluster.shards=1")
    with pytest.raises(ValueError, match=message):
        rudra.local(lambda w, b: returned(w), set=settings)


def test_an_exception_in_grad_fn_is_raised_as_it_was(tmp_path):
    rudra.save_init(str(tmp_path / "init.safetensors"), [("w", np.zeros(4, np.float32))])

    class Boom(Exception):
        pass

    def grad_fn(weights, batch):
        raise Boom("the model's own error")

    settings = external(tmp_path / "init.safetensors", 64, "protocol.kind=async", "cluster.learners=1", "cluster.shards=1")
    with pytest.raises(Boom, match="the model's own error"):
        rudra.local(grad_fn, set=settings)


def test_a_configuration_that_does_not_fit_is_refused(tmp_path):
    with pytest.raises(ValueError, match="training.init"):
        rudra.local(lambda w, b: None, set=["training.model=external", "training.dataset=external"])
    with pytest.raises(ValueError, match="not a safetensors file"):
        (tmp_path / "junk").write_bytes(b"junk")
        rudra.local(lambda w, b: None, set=external(tmp_path / "junk", 10))


@pytest.mark.parametrize("protocol", ["softsync", "easgd", "eamsgd", "downpour", "mdownpour"])
def test_every_other_protocol_trains_a_python_model(tmp_path, mnist, protocol):
    # Hardsync, async and DiLoCo have tests of their own; these run with their default rates.
    layout = Mlp(64).save(tmp_path / "init.safetensors")
    grad_fn, eval_fn = mlp_functions(layout, mnist)
    settings = external(
        tmp_path / "init.safetensors", 60000,
        f"protocol.kind={protocol}", "protocol.n=2", "cluster.learners=2", "cluster.shards=1",
        "training.batch_size=32", "training.epochs=1",
    )
    settings = [s for s in settings if protocol == "softsync" or s != "protocol.n=2"]
    result = rudra.local(grad_fn, set=settings, eval_fn=eval_fn)
    assert Mlp.accuracy(layout.views(result.weights), mnist[2], mnist[3]) >= 0.85
    assert result.summary["protocol"] == protocol
