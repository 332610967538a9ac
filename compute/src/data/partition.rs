//! Per-learner partitions of a training set and their minibatch streams.

use std::sync::Arc;

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use super::Dataset;

/// The examples one learner owns: a fixed share of a seeded permutation of the dataset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    indices: Vec<u32>,
}

impl Partition {
    /// Split `0..examples` into `parts` disjoint partitions of equal size (the remainder
    /// of `examples / parts` is left out), from one permutation drawn from `seed`.
    #[must_use]
    pub fn split(examples: usize, parts: usize, seed: u64) -> Vec<Self> {
        let mut all: Vec<u32> = (0..examples as u32).collect();
        all.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
        let size = examples / parts.max(1);
        all.chunks_exact(size.max(1)).take(parts).map(|c| Self { indices: c.to_vec() }).collect()
    }

    /// Number of examples in the partition.
    #[must_use]
    pub fn len(&self) -> usize {
        self.indices.len()
    }

    /// Whether the partition is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }
}

/// Minibatches of one partition, reshuffled every epoch from `(seed, stream, epoch)`.
/// The last incomplete batch of an epoch is skipped, so every batch has the same size.
#[derive(Clone, Debug)]
pub struct BatchStream {
    partition: Partition,
    batch: usize,
    seed: u64,
    stream: u64,
    epoch: u64,
    order: Vec<u32>,
    pos: usize,
}

impl BatchStream {
    /// A stream of `batch`-sized minibatches over `partition`; `stream` (the learner id)
    /// makes every learner's shuffle independent.
    #[must_use]
    pub fn new(partition: Partition, batch: usize, seed: u64, stream: u64) -> Self {
        let mut s =
            Self { partition, batch: batch.max(1), seed, stream, epoch: 0, order: Vec::new(), pos: 0 };
        s.reshuffle();
        s
    }

    fn reshuffle(&mut self) {
        self.order.clone_from(&self.partition.indices);
        let mix = self.seed
            ^ self.stream.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ self.epoch.wrapping_mul(0xD1B5_4A32_D192_ED03);
        self.order.shuffle(&mut ChaCha8Rng::seed_from_u64(mix));
        self.pos = 0;
    }

    /// Full batches per epoch.
    #[must_use]
    pub fn batches_per_epoch(&self) -> usize {
        self.partition.len() / self.batch
    }

    /// The epoch the next batch belongs to.
    #[must_use]
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The indices of the next minibatch. Returns an empty slice only for a partition
    /// smaller than one batch.
    pub fn next_batch(&mut self) -> &[u32] {
        if self.batches_per_epoch() == 0 {
            return &[];
        }
        if self.pos + self.batch > self.order.len() {
            self.epoch += 1;
            self.reshuffle();
        }
        let b = &self.order[self.pos..self.pos + self.batch];
        self.pos += self.batch;
        b
    }
}

/// One minibatch: the indices of its examples in the training set and, for a dataset held in
/// memory, their features (row-major) and labels (both empty for [`Dataset::external`]).
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a> {
    /// The examples' indices in the training set.
    pub indices: &'a [u32],
    /// Their features, row-major.
    pub x: &'a [f32],
    /// Their labels.
    pub labels: &'a [u8],
}

impl Batch<'_> {
    /// Number of examples.
    #[must_use]
    pub fn len(&self) -> usize {
        self.indices.len()
    }

    /// Whether the batch holds no examples.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }
}

/// A learner's minibatches, gathered from the dataset into reusable buffers.
#[derive(Clone, Debug)]
pub struct Minibatches {
    data: Arc<Dataset>,
    stream: BatchStream,
    indices: Vec<u32>,
    x: Vec<f32>,
    y: Vec<u8>,
    /// `indices`, `x` and `y` already hold the next minibatch.
    prepared: bool,
}

impl Minibatches {
    /// The minibatches of `stream` over `data`.
    #[must_use]
    pub fn new(data: Arc<Dataset>, stream: BatchStream) -> Self {
        Self { data, stream, indices: Vec::new(), x: Vec::new(), y: Vec::new(), prepared: false }
    }

    /// Gather the next minibatch now (while a learner waits for its weights, say), so that
    /// [`Self::next_batch`] hands it over at once. Preparing twice prepares one minibatch.
    pub fn prepare(&mut self) {
        if !self.prepared {
            self.indices.clear();
            self.indices.extend_from_slice(self.stream.next_batch());
            self.data.gather(&self.indices, &mut self.x, &mut self.y);
            self.prepared = true;
        }
    }

    /// The next minibatch.
    pub fn next_batch(&mut self) -> Batch<'_> {
        self.prepare();
        self.prepared = false;
        Batch { indices: &self.indices, x: &self.x, labels: &self.y }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn a_prepared_minibatch_is_the_next_one() {
        let labels = (0..20).map(|i| i % 10).collect();
        let data = Arc::new(Dataset::new(2, 10, (0..40).map(|i| i as f32).collect(), labels).unwrap());
        let stream = || BatchStream::new(Partition::split(20, 1, 3).remove(0), 4, 3, 0);
        let (mut plain, mut early) =
            (Minibatches::new(Arc::clone(&data), stream()), Minibatches::new(data, stream()));
        for step in 0..12 {
            if step % 3 == 0 {
                early.prepare();
                early.prepare();
            }
            let (a, b) = (plain.next_batch().x.to_vec(), early.next_batch().x.to_vec());
            assert_eq!(a, b, "step {step}");
        }
    }

    #[test]
    fn partitions_are_disjoint_equal_and_seeded() {
        let parts = Partition::split(103, 4, 1);
        assert_eq!(parts.len(), 4);
        let mut seen = HashSet::new();
        for p in &parts {
            assert_eq!(p.len(), 25);
            for &i in &p.indices {
                assert!(seen.insert(i), "index {i} in two partitions");
            }
        }
        assert_eq!(parts, Partition::split(103, 4, 1));
        assert_ne!(parts, Partition::split(103, 4, 2));
    }

    #[test]
    fn each_epoch_visits_every_full_batch_once_in_a_new_order() {
        let part = Partition::split(10, 1, 0).remove(0);
        let mut s = BatchStream::new(part, 3, 9, 0);
        assert_eq!(s.batches_per_epoch(), 3);
        let epoch0: Vec<u32> = (0..3).flat_map(|_| s.next_batch().to_vec()).collect();
        assert_eq!(s.epoch(), 0);
        let epoch1: Vec<u32> = (0..3).flat_map(|_| s.next_batch().to_vec()).collect();
        assert_eq!(s.epoch(), 1);
        assert_eq!(epoch0.iter().collect::<HashSet<_>>().len(), 9);
        assert_ne!(epoch0, epoch1);
    }
}
