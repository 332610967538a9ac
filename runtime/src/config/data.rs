//! Which dataset a run reads, where its files are, and loading them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rudra_actors::TrainingData;
use rudra_compute::Dataset;

use super::invalid;
use crate::RuntimeError;

/// A dataset Rudra reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DatasetKind {
    /// MNIST's IDX files (shipped in `data/mnist`).
    Mnist,
    /// Fashion-MNIST's IDX files (Debian's `dataset-fashion-mnist` installs them).
    FashionMnist,
    /// CIFAR-10's binary files.
    Cifar10,
    /// Examples the user's own loader holds (a Python learner's): only their number,
    /// `training.train_examples`, is known here.
    External,
}

impl DatasetKind {
    /// The name in the configuration.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mnist => "mnist",
            Self::FashionMnist => "fashion-mnist",
            Self::Cifar10 => "cifar10",
            Self::External => "external",
        }
    }

    pub(super) fn parse(name: &str) -> Result<Self, RuntimeError> {
        match name {
            "mnist" => Ok(Self::Mnist),
            "fashion-mnist" => Ok(Self::FashionMnist),
            "cifar10" => Ok(Self::Cifar10),
            "external" => Ok(Self::External),
            other => Err(invalid(
                "training.dataset",
                format!("{other:?} is not a known dataset (mnist, fashion-mnist, cifar10, external)"),
            )),
        }
    }

    /// Features per example: 28×28 grey or 32×32 colour pixels (none known of an external
    /// dataset).
    pub(super) fn features(self) -> usize {
        match self {
            Self::Mnist | Self::FashionMnist => 28 * 28,
            Self::Cifar10 => 32 * 32 * 3,
            Self::External => 0,
        }
    }

    /// Where the files are when `training.data_dir` is not given.
    pub(super) fn default_dir(self) -> Result<PathBuf, RuntimeError> {
        match self {
            Self::Mnist => Ok(PathBuf::from("data/mnist")),
            Self::FashionMnist => Ok(PathBuf::from("/usr/share/datasets/fashion-mnist")),
            // Never read: the examples are the user's.
            Self::External => Ok(PathBuf::new()),
            Self::Cifar10 => Err(invalid(
                "training.data_dir",
                "cifar10 has no default; give the directory of the binary version's data_batch_1.bin … \
                 data_batch_5.bin and test_batch.bin",
            )),
        }
    }

    /// What the directory must hold, for messages.
    fn files(self) -> &'static str {
        match self {
            Self::Mnist | Self::FashionMnist => "{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]",
            Self::Cifar10 => "data_batch_{1..5}.bin and test_batch.bin",
            Self::External => "nothing: an external dataset is read by the learners' own code",
        }
    }
}

/// Where the examples come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataSource {
    /// Which dataset.
    pub kind: DatasetKind,
    /// Directory with its files.
    pub dir: PathBuf,
    /// Training examples to use (`None` = all).
    pub train_examples: Option<usize>,
    /// Test examples to use (`None` = all).
    pub test_examples: Option<usize>,
}

impl DataSource {
    /// The directory, looked up relative to the working directory first and then to the
    /// source tree the binary was built from (so the shipped MNIST is found from anywhere).
    fn resolve_dir(&self) -> PathBuf {
        if self.dir.is_absolute() || self.dir.exists() {
            return self.dir.clone();
        }
        let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(&self.dir);
        if shipped.exists() { shipped } else { self.dir.clone() }
    }

    /// The directory, which must exist.
    fn existing_dir(&self) -> Result<PathBuf, RuntimeError> {
        let dir = self.resolve_dir();
        if dir.is_dir() {
            return Ok(dir);
        }
        Err(invalid(
            "training.data_dir",
            format!("{} is not a directory with {}", self.dir.display(), self.kind.files()),
        ))
    }

    /// Read the training and test sets.
    pub fn load(&self) -> Result<TrainingData, RuntimeError> {
        let (train, test) = match self.kind {
            DatasetKind::External => {
                let train = Dataset::external(self.train_examples.unwrap_or(0));
                return Ok(TrainingData { train: Arc::new(train), test: Arc::new(Dataset::external(0)) });
            }
            DatasetKind::Mnist | DatasetKind::FashionMnist => {
                rudra_compute::data::load_mnist(&self.existing_dir()?)?
            }
            DatasetKind::Cifar10 => rudra_compute::data::load_cifar10(&self.existing_dir()?)?,
        };
        let cut = |set: Dataset, n: Option<usize>| Arc::new(n.map_or_else(|| set.clone(), |n| set.head(n)));
        Ok(TrainingData { train: cut(train, self.train_examples), test: cut(test, self.test_examples) })
    }
}
