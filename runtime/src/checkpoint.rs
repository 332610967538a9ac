//! `checkpoint.safetensors`: a model's parameters as one little-endian f32 tensor per layer
//! under its conventional name (`fc1.weight` of shape `[out, in]`, `fc1.bias` of shape
//! `[out]`, …), with the model's shape and the run's settings as string metadata in the header,
//! so that other tools (Python's `safetensors` and numpy, PyTorch) read it without Rudra.
//!
//! Metadata keys: `model` (`softmax`, `mlp` or `convnet`), `inputs`, `hidden` (a JSON list of
//! widths), `classes` and, for a convolutional model, `conv` (its layers as JSON) describe the
//! model; the run adds its own (protocol, λ, μ, seed, …).

use std::collections::BTreeMap;
use std::path::Path;

use rudra_compute::{ConvSpec, CpuBackend, Dataset, GradientModel, Model, ModelSpec, ParamLayout};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use crate::RuntimeError;
use crate::config::ModelSource;
use rudra_actors::InvalidSetting;

/// Test examples per forward pass, as the scheduler evaluates.
const EVAL_CHUNK: usize = 1000;

/// A model's parameters with the metadata stored beside them.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// The model's shape.
    pub spec: ModelSpec,
    /// The parameters in the model's flat layout.
    pub params: Vec<f32>,
    /// Every metadata entry: the model's shape and the settings of the run that wrote it.
    pub metadata: BTreeMap<String, String>,
}

/// A checkpoint's results on a test set.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Evaluation {
    /// Examples classified correctly.
    pub correct: usize,
    /// Examples evaluated.
    pub examples: usize,
    /// Mean cross-entropy.
    pub loss: f64,
}

impl Evaluation {
    /// The fraction classified correctly.
    #[must_use]
    pub fn accuracy(&self) -> f64 {
        self.correct as f64 / self.examples as f64
    }
}

/// `mlp 784-256-10`, `softmax 784-10` or
/// `convnet 28×28×1 conv5x5x16 max2/2 conv5x5x32 max2/2 1568-10`.
#[must_use]
pub fn describe(spec: &ModelSpec) -> String {
    let widths: Vec<String> = std::iter::once(dense_inputs(spec))
        .chain(spec.hidden.iter().copied())
        .chain(std::iter::once(spec.classes))
        .map(|w| w.to_string())
        .collect();
    match &spec.conv {
        Some(conv) => format!("{} {conv} {}", model_name(spec), widths.join("-")),
        None => format!("{} {}", model_name(spec), widths.join("-")),
    }
}

fn model_name(spec: &ModelSpec) -> &'static str {
    match (&spec.conv, spec.hidden.is_empty()) {
        (Some(_), _) => "convnet",
        (None, true) => "softmax",
        (None, false) => "mlp",
    }
}

/// Inputs of the first fully connected layer.
fn dense_inputs(spec: &ModelSpec) -> usize {
    spec.conv.as_ref().map_or(spec.inputs, ConvSpec::features)
}

fn input_error(path: &Path, message: impl Into<String>) -> RuntimeError {
    RuntimeError::Input { path: path.to_owned(), message: message.into() }
}

/// The model described by the metadata, checked to have a parameter count that fits in memory
/// addresses.
fn spec_from(metadata: &BTreeMap<String, String>) -> Result<ModelSpec, String> {
    let get = |key: &str| {
        metadata.get(key).ok_or_else(|| {
            format!(
                "has no `{key}` metadata; a model checkpoint from rudra-node describes its model \
                 with `inputs`, `hidden` and `classes`"
            )
        })
    };
    let width = |key: &str| {
        let value = get(key)?;
        value
            .parse::<usize>()
            .ok()
            .filter(|&w| w > 0)
            .ok_or_else(|| format!("metadata `{key}` is {value:?}, not a positive whole number"))
    };
    let hidden_text = get("hidden")?;
    let hidden: Vec<usize> = serde_json::from_str(hidden_text)
        .ok()
        .filter(|h: &Vec<usize>| !h.contains(&0))
        .ok_or_else(|| format!("metadata `hidden` is {hidden_text:?}, not a list of positive widths"))?;
    let conv = metadata
        .get("conv")
        .map(|text| {
            serde_json::from_str::<ConvSpec>(text)
                .map_err(|e| format!("metadata `conv` does not describe convolutional layers: {e}"))
        })
        .transpose()?;
    let spec = ModelSpec { inputs: width("inputs")?, conv, hidden, classes: width("classes")? };
    spec.check().map_err(|e| format!("its metadata describes a model whose parts do not fit: {e}"))?;
    let widths: Vec<usize> = std::iter::once(dense_inputs(&spec))
        .chain(spec.hidden.iter().copied())
        .chain(std::iter::once(spec.classes))
        .collect();
    let params = widths
        .windows(2)
        .try_fold(0usize, |sum, w| w[0].checked_add(1)?.checked_mul(w[1])?.checked_add(sum))
        .and_then(|n| n.checked_mul(4));
    match params {
        Some(_) => Ok(spec),
        None => Err(format!("its metadata describes {}, a model too large to hold", describe(&spec))),
    }
}

/// Write `params`, laid out as `layout` (one little-endian f32 tensor per entry, under its name
/// and shape), with `metadata`, as the safetensors file `path`: checkpoints, and init files.
pub fn write_tensors(
    path: &Path,
    layout: &ParamLayout,
    params: &[f32],
    metadata: Option<std::collections::HashMap<String, String>>,
) -> Result<(), RuntimeError> {
    if params.len() != layout.len {
        return Err(RuntimeError::Config(format!(
            "{}: {} parameters for a model of {}",
            path.display(),
            params.len(),
            layout.len
        )));
    }
    let bytes: Vec<Vec<u8>> = layout
        .tensors
        .iter()
        .map(|t| params[t.range.clone()].iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let views = layout
        .tensors
        .iter()
        .zip(&bytes)
        .map(|(t, b)| TensorView::new(Dtype::F32, t.shape.clone(), b).map(|v| (t.name.clone(), v)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| RuntimeError::Config(format!("{}: {e}", path.display())))?;
    let file = safetensors::tensor::serialize(views, metadata)
        .map_err(|e| RuntimeError::Config(format!("{}: {e}", path.display())))?;
    std::fs::write(path, file).map_err(|source| RuntimeError::Io { path: path.to_owned(), source })
}

/// The metadata that describes the built-in network `spec`.
fn describe_metadata(spec: &ModelSpec) -> Result<Vec<(&'static str, String)>, RuntimeError> {
    let hidden = serde_json::to_string(&spec.hidden).map_err(|e| RuntimeError::Config(e.to_string()))?;
    let mut described = vec![
        ("model", model_name(spec).to_owned()),
        ("inputs", spec.inputs.to_string()),
        ("hidden", hidden),
        ("classes", spec.classes.to_string()),
    ];
    if let Some(conv) = &spec.conv {
        described
            .push(("conv", serde_json::to_string(conv).map_err(|e| RuntimeError::Config(e.to_string()))?));
    }
    Ok(described)
}

impl Checkpoint {
    /// Write `params`, laid out as `model`, to `path` with `run` as further metadata. A built-in
    /// network's tensors are named and described as above; an external model's keep the names
    /// and shapes of its init file.
    pub fn write(
        path: &Path,
        model: &ModelSource,
        params: &[f32],
        run: &[(&str, String)],
    ) -> Result<(), RuntimeError> {
        let described = match model {
            ModelSource::Builtin(spec) => describe_metadata(spec)?,
            ModelSource::External(init) => {
                vec![("model", "external".to_owned()), ("init", init.path.display().to_string())]
            }
        };
        let metadata = described.iter().chain(run).map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
        write_tensors(path, &model.layout(), params, Some(metadata))
    }

    /// Read the checkpoint at `path`: its model from the metadata, every tensor of that model
    /// present with its shape, and nothing else.
    pub fn read(path: &Path) -> Result<Self, RuntimeError> {
        let bytes =
            std::fs::read(path).map_err(|e| input_error(path, format!("cannot read the checkpoint: {e}")))?;
        let not_safetensors = |e: safetensors::SafeTensorError| {
            input_error(
                path,
                format!("is not a safetensors file ({e}); give the checkpoint.safetensors of a run"),
            )
        };
        let (_, header) = SafeTensors::read_metadata(&bytes).map_err(not_safetensors)?;
        let tensors = SafeTensors::deserialize(&bytes).map_err(not_safetensors)?;
        let metadata: BTreeMap<String, String> =
            header.metadata().clone().unwrap_or_default().into_iter().collect();
        let spec = spec_from(&metadata).map_err(|m| input_error(path, m))?;
        let layout = spec.layout();
        let model = describe(&spec);
        let views = layout
            .tensors
            .iter()
            .map(|t| {
                let view = tensors.tensor(&t.name).map_err(|_| {
                    input_error(
                        path,
                        format!("has no tensor {} {:?}, which the model {model} needs", t.name, t.shape),
                    )
                })?;
                if view.dtype() != Dtype::F32 || view.shape() != t.shape.as_slice() {
                    return Err(input_error(
                        path,
                        format!(
                            "tensor {} is {:?} {:?}; the model {model} needs F32 {:?}",
                            t.name,
                            view.dtype(),
                            view.shape(),
                            t.shape
                        ),
                    ));
                }
                Ok(view)
            })
            .collect::<Result<Vec<_>, _>>()?;
        if tensors.len() != layout.tensors.len() {
            let mut extra: Vec<&str> = tensors
                .names()
                .into_iter()
                .filter(|n| !layout.tensors.iter().any(|t| t.name == *n))
                .collect();
            extra.sort_unstable();
            return Err(input_error(
                path,
                format!("holds tensors the model {model} does not have: {}", extra.join(", ")),
            ));
        }
        // The layout is the tensors in order, so their data concatenated is the flat vector.
        let params = views
            .iter()
            .flat_map(|v| v.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            .collect();
        Ok(Self { spec, params, metadata })
    }

    /// Test loss and accuracy of the checkpoint's model on `test`.
    pub fn evaluate(&self, test: &Dataset) -> Result<Evaluation, RuntimeError> {
        if test.is_empty() || test.features() != self.spec.inputs || test.classes() != self.spec.classes {
            return Err(RuntimeError::Invalid(InvalidSetting::new(
                "training.dataset",
                format!(
                    "the test set has {} examples of {} features in {} classes; the checkpoint's model {} needs \
                     examples of {} features in {} classes",
                    test.len(),
                    test.features(),
                    test.classes(),
                    describe(&self.spec),
                    self.spec.inputs,
                    self.spec.classes
                ),
            )));
        }
        let mut model = Model::new(CpuBackend, self.spec.clone())?;
        model.write_params(0, &self.params)?;
        let (loss, correct) = model.evaluate_dataset(test, EVAL_CHUNK)?;
        Ok(Evaluation { correct, examples: test.len(), loss: loss / test.len() as f64 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ModelSpec {
        ModelSpec::dense(3, vec![2], 2)
    }

    fn written(dir: &Path) -> (std::path::PathBuf, Vec<f32>) {
        let path = dir.join("checkpoint.safetensors");
        let params: Vec<f32> = (0..spec().layout().len).map(|i| i as f32 * 0.25 - 1.0).collect();
        Checkpoint::write(&path, &ModelSource::Builtin(spec()), &params, &[("protocol", "async".into())])
            .unwrap();
        (path, params)
    }

    #[test]
    fn round_trip_keeps_model_parameters_and_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let (path, params) = written(dir.path());
        let c = Checkpoint::read(&path).unwrap();
        assert_eq!(c.spec, spec());
        assert_eq!(c.params, params);
        assert_eq!(c.metadata["model"], "mlp");
        assert_eq!(c.metadata["hidden"], "[2]");
        assert_eq!(c.metadata["protocol"], "async");
        assert_eq!(describe(&c.spec), "mlp 3-2-2");
    }

    #[test]
    fn convolutional_models_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cnn.safetensors");
        let spec = ModelSpec::cnn();
        let params = spec.init(4);
        Checkpoint::write(&path, &ModelSource::Builtin(spec.clone()), &params, &[]).unwrap();
        let c = Checkpoint::read(&path).unwrap();
        assert_eq!((&c.spec, &c.params), (&spec, &params));
        assert_eq!(c.metadata["model"], "convnet");
        assert_eq!(describe(&c.spec), "convnet 28×28×1 conv5x5x16 max2/2 conv5x5x32 max2/2 1568-10");
        let st = std::fs::read(&path).unwrap();
        let st = SafeTensors::deserialize(&st).unwrap();
        assert_eq!(st.tensor("conv2.weight").unwrap().shape(), [32, 16, 5, 5]);
        // Layers that do not fit their image are refused, naming the file.
        let meta = [
            ("inputs", "784"),
            ("hidden", "[]"),
            ("classes", "10"),
            ("conv", &c.metadata["conv"].replace("28", "3")),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .into_iter()
        .collect();
        let bad = dir.path().join("bad.safetensors");
        std::fs::write(&bad, safetensors::tensor::serialize(st.tensors(), Some(meta)).unwrap()).unwrap();
        let e = read_error(&bad);
        assert!(e.contains("bad.safetensors") && e.contains("conv"), "{e}");
    }

    fn read_error(path: &Path) -> String {
        match Checkpoint::read(path) {
            Err(e @ RuntimeError::Input { .. }) => e.to_string(),
            other => panic!("expected an input error, got {other:?}"),
        }
    }

    #[test]
    fn missing_corrupt_and_mismatched_files_are_named_and_explained() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none.safetensors");
        assert!(read_error(&missing).contains("none.safetensors"));

        let (path, _) = written(dir.path());
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.truncate(bytes.len() - 5);
        let cut = dir.path().join("cut.safetensors");
        std::fs::write(&cut, &bytes).unwrap();
        let e = read_error(&cut);
        assert!(e.contains("cut.safetensors") && e.contains("not a safetensors file"), "{e}");

        // The same tensors under metadata claiming a wider hidden layer.
        let wider = dir.path().join("wider.safetensors");
        let st = std::fs::read(&path).unwrap();
        let st = SafeTensors::deserialize(&st).unwrap();
        let tensors: Vec<(String, TensorView<'_>)> = st.tensors();
        let meta = [("inputs", "3"), ("hidden", "[4]"), ("classes", "2")]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .into_iter()
            .collect();
        std::fs::write(&wider, safetensors::tensor::serialize(tensors, Some(meta)).unwrap()).unwrap();
        let e = read_error(&wider);
        assert!(e.contains("fc1.weight") && e.contains("[4, 3]") && e.contains("mlp 3-4-2"), "{e}");

        let absurd = dir.path().join("absurd.safetensors");
        let meta = [("inputs", "3"), ("hidden", "[18446744073709551615]"), ("classes", "2")]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .into_iter()
            .collect();
        let tensors: Vec<(String, TensorView<'_>)> = st.tensors();
        std::fs::write(&absurd, safetensors::tensor::serialize(tensors, Some(meta)).unwrap()).unwrap();
        assert!(read_error(&absurd).contains("a model too large to hold"));
    }

    #[test]
    fn evaluation_refuses_a_dataset_of_another_shape() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = written(dir.path());
        let c = Checkpoint::read(&path).unwrap();
        let four_features = Dataset::new(4, 2, vec![0.5; 8], vec![0, 1]).unwrap();
        assert!(matches!(c.evaluate(&four_features), Err(RuntimeError::Invalid(InvalidSetting { .. }))));
        let x = vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0];
        let e = c.evaluate(&Dataset::new(3, 2, x, vec![0, 1]).unwrap()).unwrap();
        assert_eq!(e.examples, 2);
        assert!(e.loss.is_finite());
        assert_eq!(e.accuracy(), e.correct as f64 / 2.0);
    }
}
