//! [`PyModel`]: a learner's model whose gradient is a Python function of the flat weights and a
//! batch of example indices, checked at the boundary before anything of it reaches a shard.

use std::sync::{Arc, Mutex};

use numpy::ndarray::ArrayView1;
use numpy::npyffi::flags::NPY_ARRAY_WRITEABLE;
use numpy::{PyArray1, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use rudra_compute::{Batch, ComputeError, GradientModel};

/// Values of a gradient copied and checked at a time (16 KiB: well within a core's L1 cache).
const COPY_BLOCK: usize = 4096;

/// What the learners of this process share with the caller: the first Python exception a user
/// function raised (raised again when the run returns), and the run's final weights.
#[derive(Default)]
pub(crate) struct Outcome {
    /// The first error of a user function, as raised.
    pub error: Mutex<Option<PyErr>>,
    /// The final weights, given with the last evaluation.
    pub weights: Mutex<Option<Arc<Vec<f32>>>>,
}

/// The user's functions.
pub(crate) struct UserFns {
    /// `grad_fn(weights, batch) -> (loss, gradient)`.
    pub grad: Py<PyAny>,
    /// `eval_fn(weights) -> {"accuracy": …, "loss": …}`, if given.
    pub eval: Option<Py<PyAny>>,
    /// Held while one learner calls them, when the learners of this process take turns (a
    /// model object they share is not safe to call from two threads at once).
    pub turns: Option<Mutex<()>>,
}

impl UserFns {
    /// Wait for this learner's turn, if they take turns. Taken without the GIL, before it:
    /// the learner whose turn it is may need the GIL back to finish.
    fn turn(&self) -> Option<std::sync::MutexGuard<'_, ()>> {
        self.turns.as_ref().map(|m| m.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

/// A learner's model: its parameters (written by the shards) and the user's functions.
pub(crate) struct PyModel {
    fns: Arc<UserFns>,
    outcome: Arc<Outcome>,
    params: Arc<Vec<f32>>,
    grad: Vec<f32>,
}

/// Keeps the parameters a numpy view of them reads alive for as long as the view is.
#[pyclass(frozen)]
struct Keep {
    _params: Arc<Vec<f32>>,
}

impl PyModel {
    /// A model of `params` parameters, starting from zeros (the learner writes its weights).
    pub(crate) fn new(fns: Arc<UserFns>, outcome: Arc<Outcome>, params: usize) -> Self {
        Self { fns, outcome, params: Arc::new(vec![0.0; params]), grad: vec![0.0; params] }
    }

    /// Record the first error of a user function (raised in the caller as it was), and hand
    /// back what the run reports: `message`.
    fn record(&self, e: PyErr, message: String) -> ComputeError {
        let mut first = self.outcome.error.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        first.get_or_insert(e);
        ComputeError::External(message)
    }

    /// `what` raised `e`.
    fn failed(&self, what: &str, e: PyErr) -> ComputeError {
        let message = format!("{what} raised {e}");
        self.record(e, message)
    }

    /// A gradient or loss that cannot be used: a `ValueError` saying why.
    fn refused(&self, message: String) -> ComputeError {
        self.record(pyo3::exceptions::PyValueError::new_err(message.clone()), message)
    }

    /// `grad_fn(weights, batch)` into `self.grad`; the mean loss.
    fn call_grad(
        &mut self,
        py: Python<'_>,
        at: &Arc<Vec<f32>>,
        batch: Batch<'_>,
    ) -> Result<f32, ComputeError> {
        let weights = read_only_view(py, at).map_err(|e| self.failed("the weights view", e))?;
        let indices: Vec<i64> = batch.indices.iter().map(|&i| i64::from(i)).collect();
        let indices = PyArray1::from_vec(py, indices);
        let out = self.fns.grad.bind(py).call1((weights, indices)).map_err(|e| self.failed("grad_fn", e))?;
        let Ok(pair) = out.cast::<PyTuple>() else {
            return Err(self
                .refused(format!("grad_fn returned {}; it must return (loss, gradient)", type_name(&out))));
        };
        if pair.len() != 2 {
            return Err(self.refused(format!(
                "grad_fn returned {} values; it must return (loss, gradient)",
                pair.len()
            )));
        }
        let loss: f64 = pair
            .get_item(0)
            .and_then(|l| l.extract())
            .map_err(|e| self.refused(format!("grad_fn's loss is not a number: {e}")))?;
        let grad = pair.get_item(1).map_err(|e| self.failed("grad_fn", e))?;
        self.take_gradient_from(&grad)?;
        if !loss.is_finite() {
            return Err(self.refused(format!("grad_fn's loss is {loss}")));
        }
        Ok(loss as f32)
    }

    /// Copy a float32 vector of the model's length, every value finite, into `self.grad`.
    fn take_gradient_from(&mut self, grad: &Bound<'_, PyAny>) -> Result<(), ComputeError> {
        let Ok(array) = grad.cast::<PyUntypedArray>() else {
            return Err(self.refused(format!(
                "grad_fn's gradient is {}; it must be a numpy float32 array",
                type_name(grad)
            )));
        };
        let dtype = array.dtype().to_string();
        let Ok(array) = grad.cast::<PyArray1<f32>>() else {
            return Err(self.refused(format!(
                "grad_fn's gradient is a {}-d array of {dtype}; it must be a 1-d float32 array (the flat gradient)",
                array.ndim()
            )));
        };
        let array = array.readonly();
        let values =
            array.as_slice().map_err(|_| self.refused("grad_fn's gradient is not contiguous".into()))?;
        if values.len() != self.grad.len() {
            return Err(self.refused(format!(
                "grad_fn's gradient has {} values; the model has {} parameters",
                values.len(),
                self.grad.len()
            )));
        }
        // Copied a block at a time, each checked while it is in the cache: one vectorised pass
        // over the gradient, and the place of a bad value looked for only when there is one.
        let blocks = self.grad.chunks_mut(COPY_BLOCK).zip(values.chunks(COPY_BLOCK));
        let bad = blocks.enumerate().find_map(|(b, (dst, src))| {
            dst.copy_from_slice(src);
            let at = (!rudra_compute::cpu::all_finite(dst)).then(|| dst.iter().position(|v| !v.is_finite()));
            at.flatten().map(|i| (b * COPY_BLOCK + i, dst[i]))
        });
        match bad {
            Some((at, value)) => Err(self.refused(format!("grad_fn's gradient holds {value} at {at}"))),
            None => Ok(()),
        }
    }
}

/// `params` as a read-only float32 numpy array over the same memory.
fn read_only_view<'py>(py: Python<'py>, params: &Arc<Vec<f32>>) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let keep = Bound::new(py, Keep { _params: Arc::clone(params) })?;
    let view = ArrayView1::from(params.as_slice());
    // SAFETY: the array borrows the vector that `keep`, its base object, holds alive, and is
    // made read-only before any Python code sees it; the vector is never written while shared
    // (writers copy it first: `Arc::make_mut`).
    let array = unsafe { PyArray1::borrow_from_array(&view, keep.into_any()) };
    // SAFETY: the array was just made, and nothing else holds it yet.
    unsafe { (*array.as_array_ptr()).fields.flags &= !NPY_ARRAY_WRITEABLE };
    Ok(array)
}

fn type_name(value: &Bound<'_, PyAny>) -> String {
    value.get_type().name().map_or_else(|_| "an object".to_owned(), |n| n.to_string())
}

impl GradientModel for PyModel {
    fn param_count(&self) -> usize {
        self.params.len()
    }

    fn write_params(&mut self, offset: usize, values: &[f32]) -> Result<(), ComputeError> {
        let params = Arc::make_mut(&mut self.params);
        let dst = params.get_mut(offset..offset + values.len());
        dst.ok_or_else(|| {
            ComputeError::Shape(format!("{} values at {offset} of {}", values.len(), self.grad.len()))
        })?
        .copy_from_slice(values);
        Ok(())
    }

    fn loss_and_gradient(&mut self, _: &[f32], _: &[u8]) -> Result<f32, ComputeError> {
        Err(ComputeError::External("a Python model computes on batches of indices, not of examples".into()))
    }

    fn take_gradient(&mut self, out: &mut Vec<f32>) -> Result<(), ComputeError> {
        std::mem::swap(out, &mut self.grad);
        self.grad.resize(out.len(), 0.0);
        Ok(())
    }

    fn evaluate(&mut self, _: &[f32], _: &[u8]) -> Result<(f64, usize), ComputeError> {
        Err(ComputeError::External("a Python model evaluates with its eval_fn".into()))
    }

    fn gradient_on(&mut self, params: Option<&Arc<Vec<f32>>>, batch: Batch<'_>) -> Result<f32, ComputeError> {
        let at = Arc::clone(params.unwrap_or(&self.params));
        let fns = Arc::clone(&self.fns);
        let _turn = fns.turn();
        Python::attach(|py| self.call_grad(py, &at, batch))
    }

    fn evaluate_weights(
        &mut self,
        params: &Arc<Vec<f32>>,
        last: bool,
    ) -> Result<Option<(f64, f64)>, ComputeError> {
        if last {
            *self.outcome.weights.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                Some(Arc::clone(params));
        }
        let fns = Arc::clone(&self.fns);
        let Some(eval) = &fns.eval else { return Ok(None) };
        let _turn = fns.turn();
        Python::attach(|py| {
            let weights = read_only_view(py, params).map_err(|e| self.failed("the weights view", e))?;
            let out = eval.bind(py).call1((weights,)).map_err(|e| self.failed("eval_fn", e))?;
            let metric = |key: &str| -> Result<Option<f64>, ComputeError> {
                let value = out.get_item(key).ok();
                value.map(|v| v.extract::<f64>()).transpose().map_err(|e| self.failed("eval_fn", e))
            };
            let Some(accuracy) = metric("accuracy")? else {
                let e = pyo3::exceptions::PyValueError::new_err(format!(
                    "eval_fn returned {}; it must return a dict with \"accuracy\" (and optionally \"loss\")",
                    type_name(&out)
                ));
                return Err(self.failed("eval_fn", e));
            };
            Ok(Some((metric("loss")?.unwrap_or(f64::NAN), accuracy)))
        })
    }
}
