//! `training.model`: a built-in network, checked against the dataset it reads, or a model of
//! the user's own from its init file.

use std::path::Path;
use std::sync::Arc;

use rudra_compute::{ModelSpec, ParamLayout};

use super::raw::RawTraining;
use super::{DatasetKind, invalid, one_of};
use crate::RuntimeError;
use crate::init::{InitFile, MAX_PARAMS};

/// `training.model`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// Logistic regression.
    Softmax,
    /// ReLU hidden layers of `training.hidden`.
    Mlp,
    /// The 28×28 convolutional network.
    Cnn,
    /// The 32×32×3 convolutional network.
    Cifar10Net,
    /// A model of the user's own, whose learners compute gradients in Python.
    External,
}

impl ModelKind {
    const ALL: [Self; 5] = [Self::Softmax, Self::Mlp, Self::Cnn, Self::Cifar10Net, Self::External];

    /// The name in the configuration.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Softmax => "softmax",
            Self::Mlp => "mlp",
            Self::Cnn => "cnn",
            Self::Cifar10Net => "cifar10-net",
            Self::External => "external",
        }
    }

    pub(super) fn parse(name: &str) -> Result<Self, RuntimeError> {
        one_of("training.model", name, &Self::ALL, Self::as_str)
    }
}

/// What the learners train.
#[derive(Clone, Debug)]
pub enum ModelSource {
    /// A built-in network.
    Builtin(ModelSpec),
    /// A model of the user's own (`training.model = "external"`): its initial weights, from
    /// `training.init`. Its learners compute their gradients in Python (`rudra.run_learner`).
    External(Arc<InitFile>),
}

impl ModelSource {
    /// The parameters' names, shapes and ranges in the flat vector.
    #[must_use]
    pub fn layout(&self) -> ParamLayout {
        match self {
            Self::Builtin(spec) => spec.layout(),
            Self::External(init) => init.layout.clone(),
        }
    }

    /// Length of the flat parameter vector.
    #[must_use]
    pub fn param_count(&self) -> usize {
        match self {
            Self::Builtin(spec) => spec.layout().len,
            Self::External(init) => init.layout.len,
        }
    }

    /// The built-in network, or an error saying that `what` needs one.
    pub fn builtin(&self, what: &str) -> Result<&ModelSpec, RuntimeError> {
        match self {
            Self::Builtin(spec) => Ok(spec),
            Self::External(_) => Err(invalid(
                "training.model",
                format!(
                    "is external; {what} needs a built-in network (its learners compute gradients in Rust)"
                ),
            )),
        }
    }

    /// The model `training` configures for `dataset`: refused when it does not fit the
    /// dataset, is too large, or pairs an external model with a built-in dataset.
    pub(super) fn configured(
        model_kind: ModelKind,
        dataset: DatasetKind,
        t: &RawTraining,
    ) -> Result<Self, RuntimeError> {
        external_pairing(model_kind, dataset, t)?;
        let fits = |spec: ModelSpec, reads: &str| {
            if spec.inputs == dataset.features() {
                Ok(spec)
            } else {
                Err(invalid(
                    "training.model",
                    format!("{} reads {reads}, not those of {}", t.model, t.dataset),
                ))
            }
        };
        if model_kind == ModelKind::Mlp {
            check_model_size(dataset.features(), &t.hidden)?;
        }
        Ok(match model_kind {
            ModelKind::Mlp if t.hidden.is_empty() || t.hidden.contains(&0) => {
                return Err(invalid("training.hidden", "an mlp needs one or more non-zero layer widths"));
            }
            ModelKind::Mlp => {
                ModelSource::Builtin(ModelSpec::dense(dataset.features(), t.hidden.clone(), 10))
            }
            ModelKind::Softmax => ModelSource::Builtin(ModelSpec::dense(dataset.features(), Vec::new(), 10)),
            ModelKind::Cnn => {
                ModelSource::Builtin(fits(ModelSpec::cnn(), "28×28 grey images (mnist, fashion-mnist)")?)
            }
            ModelKind::Cifar10Net => {
                ModelSource::Builtin(fits(ModelSpec::cifar10_net(), "32×32 colour images (cifar10)")?)
            }
            ModelKind::External => {
                let path = t.init.as_deref().unwrap_or(Path::new(""));
                ModelSource::External(Arc::new(InitFile::read(path)?))
            }
        })
    }
}

/// `training.model = "external"` and `training.dataset = "external"` go together, with
/// `training.init` and `training.train_examples`; `training.init` belongs to them alone.
fn external_pairing(model: ModelKind, dataset: DatasetKind, t: &RawTraining) -> Result<(), RuntimeError> {
    let external = model == ModelKind::External;
    if external != (dataset == DatasetKind::External) {
        return Err(invalid(
            "training.model",
            format!(
                "is {:?} with training.dataset {:?}: a model of your own reads its own examples, so \
                 training.model and training.dataset are both \"external\" or neither is",
                t.model, t.dataset
            ),
        ));
    }
    match (external, &t.init) {
        (true, None) => Err(invalid(
            "training.init",
            "an external model needs its initial weights: a safetensors file (from \
             safetensors.torch.save_file(model.state_dict(), ...), say)",
        )),
        (true, Some(_)) if t.train_examples == 0 => Err(invalid(
            "training.train_examples",
            "an external dataset needs its size: the number of examples your loader indexes",
        )),
        (false, Some(_)) => Err(invalid(
            "training.init",
            format!("is for training.model = \"external\"; {} starts from training.seed", t.model),
        )),
        _ => Ok(()),
    }
}

/// An MLP from `inputs` features through `hidden` to 10 classes must stay within
/// [`MAX_PARAMS`]; checked before anything is allocated.
fn check_model_size(inputs: usize, hidden: &[usize]) -> Result<(), RuntimeError> {
    let widths = std::iter::once(inputs).chain(hidden.iter().copied()).chain([10]);
    let params = widths
        .clone()
        .zip(widths.skip(1))
        .try_fold(0u64, |sum, (a, b)| (a as u64 + 1).checked_mul(b as u64).and_then(|n| sum.checked_add(n)))
        .filter(|&n| n <= MAX_PARAMS);
    if params.is_none() {
        return Err(invalid(
            "training.hidden",
            format!("{hidden:?} makes a model of more than {MAX_PARAMS} parameters"),
        ));
    }
    Ok(())
}
