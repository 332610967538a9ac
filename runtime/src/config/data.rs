//! Which dataset a run reads, where its files are, and loading them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rudra_actors::TrainingData;

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
}

impl DatasetKind {
    /// The name in the configuration.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mnist => "mnist",
            Self::FashionMnist => "fashion-mnist",
            Self::Cifar10 => "cifar10",
        }
    }

    pub(super) fn parse(name: &str) -> Result<Self, RuntimeError> {
        match name {
            "mnist" => Ok(Self::Mnist),
            "fashion-mnist" => Ok(Self::FashionMnist),
            "cifar10" => Ok(Self::Cifar10),
            other => Err(invalid(
                "training.dataset",
                format!("{other:?} is not a known dataset (mnist, fashion-mnist, cifar10)"),
            )),
        }
    }

    /// Features per example: 28×28 grey or 32×32 colour pixels.
    pub(super) fn features(self) -> usize {
        match self {
            Self::Mnist | Self::FashionMnist => 28 * 28,
            Self::Cifar10 => 32 * 32 * 3,
        }
    }

    /// Where the files are when `training.data_dir` is not given.
    pub(super) fn default_dir(self) -> Result<PathBuf, RuntimeError> {
        match self {
            Self::Mnist => Ok(PathBuf::from("data/mnist")),
            Self::FashionMnist => Ok(PathBuf::from("/usr/share/datasets/fashion-mnist")),
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

    /// Read the training and test sets.
    pub fn load(&self) -> Result<TrainingData, RuntimeError> {
        let dir = self.resolve_dir();
        if !dir.is_dir() {
            return Err(invalid(
                "training.data_dir",
                format!("{} is not a directory with {}", self.dir.display(), self.kind.files()),
            ));
        }
        let (train, test) = match self.kind {
            DatasetKind::Mnist | DatasetKind::FashionMnist => rudra_compute::data::load_mnist(&dir)?,
            DatasetKind::Cifar10 => rudra_compute::data::load_cifar10(&dir)?,
        };
        let cut = |set: rudra_compute::Dataset, n: Option<usize>| {
            Arc::new(n.map_or_else(|| set.clone(), |n| set.head(n)))
        };
        Ok(TrainingData { train: cut(train, self.train_examples), test: cut(test, self.test_examples) })
    }
}
