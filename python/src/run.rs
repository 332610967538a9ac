//! The runs a Python caller starts: a learner of a distributed run, or a whole cluster in this
//! process. Each runs on a thread of its own while the caller's thread waits without the GIL,
//! waking to let Python handle its signals (Ctrl-C stops the run cleanly).

use std::path::PathBuf;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use numpy::{PyArray1, PyUntypedArrayMethods};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use rudra_actors::Models;
use rudra_compute::{CpuBackend, Device};
use rudra_runtime::local::{ProgressMode, run_local_with};
use rudra_runtime::node::NodeOptions;
use rudra_runtime::{Config, RunDir, RuntimeError, Summary};
use tokio::sync::Notify;

use crate::model::{Outcome, PyModel, UserFns};

/// How often the waiting thread lets Python look at its signals.
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// A run's result: its final weights and its summary.
#[pyclass(frozen, module = "rudra")]
pub(crate) struct RunResult {
    /// The final weights of the run, the flat float32 vector.
    #[pyo3(get)]
    weights: Py<PyArray1<f32>>,
    /// The run's `summary.json`, as a dict (`run_learner`: as the scheduler gave it at the end).
    #[pyo3(get)]
    summary: Py<PyDict>,
    /// `local` with `out`: the run directory written.
    #[pyo3(get)]
    run_dir: Option<PathBuf>,
}

#[pymethods]
impl RunResult {
    fn __repr__(&self, py: Python<'_>) -> String {
        let summary = self.summary.bind(py);
        let accuracy =
            summary.get_item("final_test_accuracy").ok().flatten().map_or("?".into(), |a| a.to_string());
        let len = PyUntypedArrayMethods::len(self.weights.bind(py));
        format!("RunResult(weights=<{len} float32>, final_test_accuracy={accuracy})")
    }
}

/// A runtime error as a Python exception: bad input is a `ValueError`, the rest a
/// `RuntimeError`.
pub(crate) fn to_py(e: RuntimeError) -> PyErr {
    match e.exit_code() {
        2 => PyValueError::new_err(e.to_string()),
        _ => PyRuntimeError::new_err(e.to_string()),
    }
}

/// Log to stderr at `RUDRA_LOG` (default `warn`), once per process.
pub(crate) fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RUDRA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // Another subscriber already installed (by an embedding program) wins.
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// Models for `config` whose learners call `fns`.
fn models(config: &Config, fns: &Arc<UserFns>, outcome: &Arc<Outcome>) -> Models {
    let models = config.models(Device::Cpu(CpuBackend));
    let (fns, outcome, params) = (Arc::clone(fns), Arc::clone(outcome), models.param_count());
    models.with_learners(move || Ok(PyModel::new(Arc::clone(&fns), Arc::clone(&outcome), params)))
}

/// How long an interrupted run has to say goodbye before the caller gets its
/// `KeyboardInterrupt` anyway (a learner still joining has nobody to say it to).
const GOODBYE: Duration = Duration::from_secs(5);

/// Run `work` on a thread of its own; wait for it without the GIL, handing it `interrupt` when
/// Python raises on a signal (and then waiting a little for it to end).
fn wait_for<T: Send + 'static>(
    py: Python<'_>,
    interrupt: Option<&Arc<Notify>>,
    work: impl FnOnce() -> T + Send + 'static,
) -> PyResult<T> {
    let (tx, rx) = mpsc::channel();
    // Waited on without the GIL, so shared with that closure.
    let rx = Mutex::new(rx);
    let thread = std::thread::Builder::new()
        .name("rudra".into())
        .spawn(move || drop(tx.send(work())))
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start the run's thread: {e}")))?;
    let mut signal: Option<(PyErr, Instant)> = None;
    loop {
        match py.detach(|| rx.lock().unwrap_or_else(PoisonError::into_inner).recv_timeout(SIGNAL_CHECK)) {
            Ok(done) => {
                let _ = thread.join();
                return signal.map_or(Ok(done), |(e, _)| Err(e));
            }
            Err(RecvTimeoutError::Timeout) => match signal {
                Some((e, at)) if at.elapsed() > GOODBYE => return Err(e),
                Some(_) => {}
                None => {
                    if let Err(e) = py.check_signals() {
                        match interrupt {
                            Some(n) => n.notify_one(),
                            // A run of this process has no goodbye to say: it ends with the process.
                            None => return Err(e),
                        }
                        signal = Some((e, Instant::now()));
                    }
                }
            },
            Err(RecvTimeoutError::Disconnected) => {
                return Err(PyRuntimeError::new_err("the run's thread ended without a result (it panicked)"));
            }
        }
    }
}

/// What a run that ended gives its caller: the error a user function raised, if any (raised as
/// it was, whatever else went wrong), else the run's own result.
fn finished<T>(outcome: &Outcome, ran: PyResult<Result<T, RuntimeError>>) -> PyResult<T> {
    if let Some(e) = outcome.error.lock().unwrap_or_else(PoisonError::into_inner).take() {
        return Err(e);
    }
    ran?.map_err(to_py)
}

/// Join the cluster whose scheduler is at `scheduler` as a learner whose gradients
/// `grad_fn(weights, batch) -> (loss, gradient)` computes, and train until the run ends.
///
/// The node's identity is its certificate in `certs` (named `name`), or one it enrols for with
/// the join `token`, checking the scheduler against `ca`. `eval_fn(weights) -> {"accuracy": …,
/// "loss": …}`, if given, is called at the run's evaluation points of an external model; the
/// scheduler records what it returns. Returns the run's final weights and its summary.
#[pyfunction]
#[pyo3(signature = (grad_fn, *, scheduler, certs = None, name = None, ca = None, token = None, eval_fn = None, connect_timeout = 60.0))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_learner(
    py: Python<'_>,
    grad_fn: Py<PyAny>,
    scheduler: String,
    certs: Option<PathBuf>,
    name: Option<String>,
    ca: Option<PathBuf>,
    token: Option<String>,
    eval_fn: Option<Py<PyAny>>,
    connect_timeout: f64,
) -> PyResult<RunResult> {
    let timeout = Duration::try_from_secs_f64(connect_timeout).map_err(|_| {
        PyValueError::new_err(format!("connect_timeout is {connect_timeout}; give seconds, 0 or more"))
    })?;
    let interrupt = Arc::new(Notify::new());
    let mut opts = NodeOptions::new(name.clone(), certs.unwrap_or_else(|| PathBuf::from("certs")));
    opts.scheduler = Some(scheduler);
    opts.ca = ca;
    opts.token = token;
    opts.connect_timeout = timeout;
    opts.interrupt = Some(Arc::clone(&interrupt));
    // One learner in this process: nothing to take turns with.
    let fns = Arc::new(UserFns { grad: grad_fn, eval: eval_fn, turns: None });
    let outcome = Arc::new(Outcome::default());
    let (shared, held) = (Arc::clone(&outcome), Arc::clone(&fns));
    let ran = wait_for(py, Some(&interrupt), move || {
        let make = |config: &Config| Ok(models(config, &held, &shared));
        rudra_runtime::node::run_learner(&opts, None, Some(&make))
    });
    // The user functions are dropped here, with the GIL held.
    drop(fns);
    let summary = finished(&outcome, ran)?;
    let missing = |what: &str| {
        PyRuntimeError::new_err(format!(
            "the run ended without handing this learner its {what} (a scheduler of another version?)"
        ))
    };
    let weights = outcome.weights.lock().unwrap_or_else(PoisonError::into_inner).take();
    let weights = weights.ok_or_else(|| missing("final weights"))?;
    let summary = summary.ok_or_else(|| missing("summary"))?;
    Ok(RunResult { weights: vec_to_numpy(py, &weights), summary: dict_of(py, &summary)?, run_dir: None })
}

/// Run the whole cluster of `config` (a TOML file; `set` overrides keys as `section.key=value`)
/// in this process, every learner calling `grad_fn`, and `eval_fn` at the evaluation points of
/// an external model. The learners, each on a thread of its own, call them one at a time
/// unless `concurrent` (for functions safe to run side by side: no shared buffers or module
/// state). With `out`, the run directory is written there as `rudra-node local` writes it.
#[pyfunction]
#[pyo3(signature = (grad_fn, *, config = None, set = Vec::new(), eval_fn = None, out = None, concurrent = false))]
pub(crate) fn local(
    py: Python<'_>,
    grad_fn: Py<PyAny>,
    config: Option<PathBuf>,
    set: Vec<String>,
    eval_fn: Option<Py<PyAny>>,
    out: Option<PathBuf>,
    concurrent: bool,
) -> PyResult<RunResult> {
    let config = Config::load(config.as_deref(), &set).map_err(to_py)?;
    let data = config.data.load().map_err(to_py)?;
    let turns = (!concurrent).then(|| std::sync::Mutex::new(()));
    let fns = Arc::new(UserFns { grad: grad_fn, eval: eval_fn, turns });
    let outcome = Arc::new(Outcome::default());
    let models = models(&config, &fns, &outcome);
    let dir = out.map(|o| RunDir::create(Some(&o), config.protocol_name())).transpose().map_err(to_py)?;
    if let Some(dir) = &dir {
        dir.write_config(&config).map_err(to_py)?;
    }
    let (run_config, run_dir) = (config.clone(), dir.as_ref().map(|d| d.path().to_owned()));
    let ran = wait_for(py, None, move || {
        run_local_with(&run_config, models, data, run_dir.as_deref(), ProgressMode::Quiet, None)
    });
    drop(fns);
    let report = finished(&outcome, ran)?;
    let summary = match &dir {
        Some(dir) => dir.record(&config, &report).map_err(to_py)?.summary,
        None => Summary::new(&config, &report),
    };
    Ok(RunResult {
        weights: vec_to_numpy(py, &report.params),
        summary: dict_of(
            py,
            &serde_json::to_string(&summary).map_err(|e| PyRuntimeError::new_err(e.to_string()))?,
        )?,
        run_dir: dir.map(|d| d.path().to_owned()),
    })
}

/// The dict `json.loads` makes of `json`, a run's `summary.json`.
fn dict_of(py: Python<'_>, json: &str) -> PyResult<Py<PyDict>> {
    Ok(py.import("json")?.call_method1("loads", (json,))?.cast_into::<PyDict>()?.unbind())
}

fn vec_to_numpy(py: Python<'_>, values: &[f32]) -> Py<PyArray1<f32>> {
    PyArray1::from_slice(py, values).unbind()
}
