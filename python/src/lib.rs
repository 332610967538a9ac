//! `rudra._rudra`: Rudra's learner with a gradient function written in Python. Everything but the
//! gradient stays in Rust: the protocols, the shards, the staleness, the local optimizers and
//! the network. See `python/rudra/__init__.py` for the Python face of it.
//!
//! - `run_learner` (`run.rs`): one learner of a cluster whose scheduler and shards are
//!   `rudra-node` processes.
//! - `local` (`run.rs`): a whole cluster in this process, every learner calling the same function.
//! - `save_init` and `init_layout`: `training.init`, the initial weights, written and read.
//! - `PyModel` (`model.rs`): the learner's model that calls the user's functions.

mod model;
mod run;

use std::path::PathBuf;

use numpy::PyUntypedArrayMethods;
use pyo3::prelude::*;

/// Write `tensors` (name → float32 array) as the safetensors file `path`, an
/// init file for `training.init`.
#[pyfunction]
fn save_init(path: PathBuf, tensors: Vec<(String, numpy::PyReadonlyArrayDyn<'_, f32>)>) -> PyResult<()> {
    let (mut placed, mut params) = (Vec::with_capacity(tensors.len()), Vec::new());
    for (name, array) in &tensors {
        let values = array.as_slice().map_err(|_| {
            pyo3::exceptions::PyValueError::new_err(format!(
                "tensor {name} is not contiguous; pass np.ascontiguousarray"
            ))
        })?;
        let range = params.len()..params.len() + values.len();
        params.extend_from_slice(values);
        placed.push(rudra_compute::TensorInfo { name: name.clone(), shape: array.shape().to_vec(), range });
    }
    let layout = rudra_compute::ParamLayout { len: params.len(), tensors: placed };
    rudra_runtime::checkpoint::write_tensors(&path, &layout, &params, None).map_err(run::to_py)
}

/// One tensor of a layout: its name, its shape, and where it starts and ends in the flat vector.
type Placed = (String, Vec<usize>, usize, usize);

/// The tensors of the init file `path` in file order, which is the order of the flat parameter
/// vector: `[(name, shape, start, end)]`.
#[pyfunction]
fn init_layout(path: PathBuf) -> PyResult<Vec<Placed>> {
    let init = rudra_runtime::init::InitFile::read(&path).map_err(run::to_py)?;
    Ok(init.layout.tensors.into_iter().map(|t| (t.name, t.shape, t.range.start, t.range.end)).collect())
}

/// Seconds per call of `grad_fn` through the binding, as a learner calls it: the weights view,
/// the batch's indices, the call, the checks and the copy of the gradient (a model of `params`
/// parameters, batches of `batch`). For the benchmark (`python/benches/learners.py`).
#[pyfunction]
fn _binding_cost(
    py: Python<'_>,
    grad_fn: Py<PyAny>,
    params: usize,
    batch: usize,
    calls: usize,
) -> PyResult<f64> {
    use rudra_compute::GradientModel;
    let fns = std::sync::Arc::new(model::UserFns { grad: grad_fn, eval: None, turns: None });
    let mut m = model::PyModel::new(fns, std::sync::Arc::default(), params);
    let weights = std::sync::Arc::new(vec![0.0f32; params]);
    let indices: Vec<u32> = (0..batch as u32).collect();
    let batch = rudra_compute::Batch { indices: &indices, x: &[], labels: &[] };
    let mut out = vec![0.0; params];
    let started = std::time::Instant::now();
    for _ in 0..calls {
        py.detach(|| m.gradient_on(Some(&weights), batch).and_then(|_| m.take_gradient(&mut out)))
            .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
    }
    Ok(started.elapsed().as_secs_f64() / calls.max(1) as f64)
}

/// The extension module.
#[pymodule]
fn _rudra(m: &Bound<'_, PyModule>) -> PyResult<()> {
    run::init_logging();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<run::RunResult>()?;
    m.add_function(wrap_pyfunction!(run::run_learner, m)?)?;
    m.add_function(wrap_pyfunction!(run::local, m)?)?;
    m.add_function(wrap_pyfunction!(save_init, m)?)?;
    m.add_function(wrap_pyfunction!(init_layout, m)?)?;
    m.add_function(wrap_pyfunction!(_binding_cost, m)?)?;
    Ok(())
}
