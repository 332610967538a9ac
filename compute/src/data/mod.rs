//! Datasets: IDX files (plain or gzipped) for MNIST and Fashion-MNIST, CIFAR-10's binary
//! files, and per-learner partitions.

mod cifar;
mod idx;
mod partition;

use std::path::{Path, PathBuf};

pub use cifar::load_cifar10;
pub use idx::{IdxArray, read_idx};
pub use partition::{ADAPTIVE_WARMUP_STEPS, Batch, BatchStream, Minibatches, Partition};

use crate::ComputeError;

/// A labelled classification dataset held in memory, features scaled to `[0, 1]`; or only the
/// number of examples of a dataset the user's own code holds ([`Dataset::external`]).
#[derive(Clone, Debug)]
pub struct Dataset {
    features: usize,
    classes: usize,
    x: Vec<f32>,
    y: Vec<u8>,
    len: usize,
}

impl Dataset {
    /// A dataset from row-major features (`labels.len()` rows of `features`) and labels.
    pub fn new(features: usize, classes: usize, x: Vec<f32>, y: Vec<u8>) -> Result<Self, ComputeError> {
        if features == 0 || x.len() != y.len() * features {
            return Err(ComputeError::Shape(format!(
                "{} feature values do not form {} rows of {features}",
                x.len(),
                y.len()
            )));
        }
        if let Some(bad) = y.iter().find(|&&l| usize::from(l) >= classes) {
            return Err(ComputeError::Shape(format!("label {bad} is not below the {classes} classes")));
        }
        let len = y.len();
        Ok(Self { features, classes, x, y, len })
    }

    /// A dataset of `examples` examples held outside Rudra (by a Python learner's loader, say):
    /// learners are given their minibatches as indices into it ([`Batch::indices`]), with no
    /// features or labels.
    #[must_use]
    pub fn external(examples: usize) -> Self {
        Self { features: 0, classes: 0, x: Vec::new(), y: Vec::new(), len: examples }
    }

    /// Whether the examples are held outside Rudra ([`Dataset::external`]).
    #[must_use]
    pub fn is_external(&self) -> bool {
        self.features == 0
    }

    /// Images and labels from a pair of IDX files (`N×rows×cols` bytes, `N` labels).
    pub fn from_idx(images: &Path, labels: &Path, classes: usize) -> Result<Self, ComputeError> {
        let img = read_idx(images)?;
        let lab = read_idx(labels)?;
        let format = |path: &Path, reason: String| ComputeError::Format { path: path.to_owned(), reason };
        if img.dims.len() < 2 {
            return Err(format(
                images,
                format!("expected an array of images, found dimensions {:?}", img.dims),
            ));
        }
        if lab.dims.len() != 1 || lab.dims[0] != img.dims[0] {
            return Err(format(
                labels,
                format!(
                    "expected {} labels to match {}, found dimensions {:?}",
                    img.dims[0],
                    images.display(),
                    lab.dims
                ),
            ));
        }
        if let Some(bad) = lab.data.iter().find(|&&l| usize::from(l) >= classes) {
            return Err(format(labels, format!("label {bad} is not below the {classes} classes")));
        }
        if img.dims[0] == 0 || img.dims[1..].contains(&0) {
            return Err(format(images, format!("holds no images (dimensions {:?})", img.dims)));
        }
        let features = img.dims[1..].iter().product();
        let x = img.data.iter().map(|&p| f32::from(p) / 255.0).collect();
        Self::new(features, classes, x, lab.data)
    }

    /// Number of examples.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the dataset has no examples.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Features per example.
    #[must_use]
    pub fn features(&self) -> usize {
        self.features
    }

    /// Number of classes.
    #[must_use]
    pub fn classes(&self) -> usize {
        self.classes
    }

    /// The first `n` examples (all of them when `n` is larger).
    #[must_use]
    pub fn head(&self, n: usize) -> Self {
        let n = n.min(self.len());
        if self.is_external() {
            return Self::external(n);
        }
        Self { x: self.x[..n * self.features].to_vec(), y: self.y[..n].to_vec(), len: n, ..*self }
    }

    /// Copy the examples at `indices` into `x` (row-major) and `y`, replacing their contents
    /// (nothing for an external dataset: its examples are not here).
    ///
    /// # Panics
    /// If an index is out of range: indices come from a [`Partition`] of this dataset.
    pub fn gather(&self, indices: &[u32], x: &mut Vec<f32>, y: &mut Vec<u8>) {
        x.clear();
        y.clear();
        if self.is_external() {
            return;
        }
        for &i in indices {
            let i = i as usize;
            x.extend_from_slice(&self.x[i * self.features..(i + 1) * self.features]);
            y.push(self.y[i]);
        }
    }

    /// Consecutive chunks of at most `rows` examples: `(features, labels)`.
    pub fn chunks(&self, rows: usize) -> impl Iterator<Item = (&[f32], &[u8])> {
        self.x.chunks(rows * self.features).zip(self.y.chunks(rows))
    }
}

/// The four MNIST files of a directory, gzipped (`*.gz`) or not.
fn mnist_file(dir: &Path, stem: &str) -> PathBuf {
    let gz = dir.join(format!("{stem}.gz"));
    if gz.exists() { gz } else { dir.join(stem) }
}

/// Open the dataset file `path` for reading: a regular file (a FIFO or a device would block or
/// never end) of at most `max_bytes`.
pub(crate) fn open_regular(path: &Path, max_bytes: u64) -> Result<std::fs::File, ComputeError> {
    let io = |source| ComputeError::Io { path: path.to_owned(), source };
    let meta = std::fs::metadata(path).map_err(io)?;
    let bad = |reason: String| ComputeError::Format { path: path.to_owned(), reason };
    if !meta.is_file() {
        return Err(bad("is not a regular file".into()));
    }
    if meta.len() > max_bytes {
        return Err(bad(format!(
            "is {} bytes, more than the {max_bytes} a dataset file may hold",
            meta.len()
        )));
    }
    std::fs::File::open(path).map_err(io)
}

/// MNIST (or Fashion-MNIST, same layout) from a directory holding
/// `{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]`: `(train, test)`.
pub fn load_mnist(dir: &Path) -> Result<(Dataset, Dataset), ComputeError> {
    let split = |prefix: &str| {
        let images = mnist_file(dir, &format!("{prefix}-images-idx3-ubyte"));
        let set = Dataset::from_idx(&images, &mnist_file(dir, &format!("{prefix}-labels-idx1-ubyte")), 10)?;
        if set.features() != 28 * 28 {
            return Err(ComputeError::Format {
                path: images,
                reason: format!("images of {} pixels; MNIST's are 28×28 (784)", set.features()),
            });
        }
        Ok(set)
    };
    Ok((split("train")?, split("t10k")?))
}
