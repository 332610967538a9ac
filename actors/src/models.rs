//! [`Models`]: what a cluster trains. The learners each get a model of their own, the scheduler
//! one more to evaluate the assembled parameters on the test set, and the shards start from one
//! initial parameter vector. The built-in networks come from a [`ModelSpec`]; a model of your own
//! is any [`GradientModel`].

use std::sync::Arc;

use rudra_compute::{ComputeError, CpuBackend, Dataset, Device, GradientModel, Model, ModelSpec};

use crate::InvalidSetting;

/// Builds one model.
type Make = Arc<dyn Fn() -> Result<Box<dyn GradientModel>, ComputeError> + Send + Sync>;

/// The models of a run: a factory for the learners' models and the evaluator's, and the
/// parameters every shard and learner starts from.
#[derive(Clone)]
pub struct Models {
    init: Arc<Vec<f32>>,
    learner: Make,
    /// None: the run's model is not here to evaluate (an external model's learners evaluate).
    evaluator: Option<Make>,
    /// The built-in network, when it is one: its inputs and classes are checked against the data.
    spec: Option<ModelSpec>,
}

impl std::fmt::Debug for Models {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Models").field("params", &self.init.len()).field("spec", &self.spec).finish()
    }
}

impl Models {
    /// The built-in network `spec`, initialised from `seed`: the learners compute on `device`,
    /// the scheduler evaluates on the CPU.
    #[must_use]
    pub fn builtin(spec: &ModelSpec, seed: u64, device: Device) -> Self {
        let (on_device, on_cpu) = (spec.clone(), spec.clone());
        Self {
            init: Arc::new(spec.init(seed)),
            learner: Arc::new(move || Ok(Box::new(Model::new(device.clone(), on_device.clone())?))),
            evaluator: Some(Arc::new(move || Ok(Box::new(Model::new(CpuBackend, on_cpu.clone())?)))),
            spec: Some(spec.clone()),
        }
    }

    /// A model of your own: `make` builds one (called once for every learner and once for the
    /// scheduler's evaluations), and every shard and learner starts from `init`, whose length
    /// must be the models' [`GradientModel::param_count`].
    pub fn custom<M, F>(init: impl Into<Arc<Vec<f32>>>, make: F) -> Self
    where
        M: GradientModel,
        F: Fn() -> Result<M, ComputeError> + Send + Sync + 'static,
    {
        let make: Make = Arc::new(move || Ok(Box::new(make()?)));
        Self { init: init.into(), learner: Arc::clone(&make), evaluator: Some(make), spec: None }
    }

    /// The model of a run whose learners bring their own (`training.model = "external"`, Python
    /// learners): only the parameters the run starts from. The shards and the scheduler need no
    /// more; a learner of this process cannot be built, and the learners evaluate.
    #[must_use]
    pub fn external(init: Arc<Vec<f32>>) -> Self {
        let learner: Make = Arc::new(|| {
            Err(ComputeError::External(
                "the run's model is external: its learners compute their gradients in Python; start them \
                 with rudra.run_learner"
                    .into(),
            ))
        });
        Self { init, learner, evaluator: None, spec: None }
    }

    /// These models with each learner's made by `make` (a Python learner's, computing on the
    /// run's parameters): the shards' initial parameters and the scheduler's evaluation stay.
    #[must_use]
    pub fn with_learners<M, F>(mut self, make: F) -> Self
    where
        M: GradientModel,
        F: Fn() -> Result<M, ComputeError> + Send + Sync + 'static,
    {
        self.learner = Arc::new(move || Ok(Box::new(make()?)));
        self
    }

    /// Length of the flat parameter vector.
    #[must_use]
    pub fn param_count(&self) -> usize {
        self.init.len()
    }

    /// The parameters the run starts from.
    #[must_use]
    pub fn init(&self) -> &Arc<Vec<f32>> {
        &self.init
    }

    /// A new model for a learner.
    pub fn learner(&self) -> Result<Box<dyn GradientModel>, ComputeError> {
        self.checked((self.learner)()?)
    }

    /// A new model for the scheduler's evaluations; `None` when the learners evaluate
    /// ([`Models::external`]).
    #[must_use]
    pub fn evaluator(&self) -> Option<Result<Box<dyn GradientModel>, ComputeError>> {
        self.evaluator.as_ref().map(|make| self.checked(make()?))
    }

    fn checked(&self, model: Box<dyn GradientModel>) -> Result<Box<dyn GradientModel>, ComputeError> {
        if model.param_count() == self.init.len() {
            Ok(model)
        } else {
            Err(ComputeError::Shape(format!(
                "the model has {} parameters but the run starts from {}",
                model.param_count(),
                self.init.len()
            )))
        }
    }

    /// Check that a built-in network reads examples of `set` (features and classes); a model
    /// of your own checks its inputs itself.
    pub fn check_data(&self, name: &str, set: &Dataset) -> Result<(), InvalidSetting> {
        let Some(spec) = &self.spec else { return Ok(()) };
        if set.features() == spec.inputs && set.classes() == spec.classes {
            return Ok(());
        }
        Err(InvalidSetting::new(
            "training.dataset",
            format!(
                "the {name} set has {} features and {} classes; the model expects {} and {}",
                set.features(),
                set.classes(),
                spec.inputs,
                spec.classes
            ),
        ))
    }
}
