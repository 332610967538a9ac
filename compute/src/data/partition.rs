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

/// Adaptive batch sizes: the steps of epoch 0 every learner takes at μ before the first
/// sizes chosen from measured speed apply (or the whole epoch, if shorter).
pub const ADAPTIVE_WARMUP_STEPS: usize = 16;

/// Where a stream's examples come from each epoch.
#[derive(Clone, Debug)]
enum Draw {
    /// The learner's own partition, reshuffled every epoch.
    Fixed(Partition),
    /// Adaptive batch sizes (`docs/src/algorithms.md` §5.1): every learner draws the same
    /// permutation π_e of the training set in epoch e, and step s of the epoch takes the s-th
    /// run of μλ examples of it, split among the learners by that step's sizes, in learner
    /// order. Steps of one epoch never share an example, whatever the sizes, so every example
    /// is used once per epoch.
    Planned {
        /// Examples in the training set.
        examples: usize,
        /// Steps per epoch: ⌊examples / μλ⌋.
        steps: usize,
        /// The first steps of epoch 0, at μ everywhere.
        warmup: usize,
        /// μ for every learner.
        uniform: Vec<u32>,
        /// `sizes[e][l]`, for the epochs chosen so far (epoch 0's apply after the warm-up).
        sizes: Vec<Vec<u32>>,
    },
}

/// Minibatches of one learner, drawn anew every epoch from `(seed, stream, epoch)`: from its
/// fixed partition, or, with adaptive batch sizes, from its share of each step's run of the
/// epoch's permutation. The last incomplete batch of an epoch is skipped.
#[derive(Clone, Debug)]
pub struct BatchStream {
    draw: Draw,
    batch: usize,
    seed: u64,
    stream: u64,
    epoch: u64,
    order: Vec<u32>,
    /// Fixed: the next example of `order`; planned: the next step of the epoch.
    pos: usize,
}

impl BatchStream {
    /// A stream of `batch`-sized minibatches over `partition`; `stream` (the learner id)
    /// makes every learner's shuffle independent.
    #[must_use]
    pub fn new(partition: Partition, batch: usize, seed: u64, stream: u64) -> Self {
        Self::with_draw(Draw::Fixed(partition), batch, seed, stream)
    }

    /// Learner `learner`'s stream of `learners` with adaptive batch sizes over a training set
    /// of `examples`, with nominal minibatch `batch` (μ, every learner's size in the warm-up);
    /// the sizes of each epoch come from [`Self::set_sizes`].
    #[must_use]
    pub fn adaptive(examples: usize, learners: usize, batch: usize, seed: u64, learner: usize) -> Self {
        let (learners, batch) = (learners.max(1), batch.max(1));
        let steps = examples / (learners * batch);
        let draw = Draw::Planned {
            examples,
            steps,
            warmup: ADAPTIVE_WARMUP_STEPS.min(steps),
            uniform: vec![batch as u32; learners],
            sizes: Vec::new(),
        };
        Self::with_draw(draw, batch, seed, learner as u64)
    }

    fn with_draw(draw: Draw, batch: usize, seed: u64, stream: u64) -> Self {
        let mut s = Self { draw, batch: batch.max(1), seed, stream, epoch: 0, order: Vec::new(), pos: 0 };
        s.reshuffle();
        s
    }

    /// Adaptive batch sizes: every learner's size in each epoch chosen so far (`sizes[e][l]`,
    /// from epoch 0, whose sizes apply after its warm-up). Each epoch's sizes must name every
    /// learner, be at least 1 and sum to μλ, and an epoch's sizes never change once given;
    /// sizes that break a rule are refused and change nothing.
    pub fn set_sizes(&mut self, new: &[Vec<u32>]) -> Result<(), String> {
        let Draw::Planned { uniform, sizes, .. } = &mut self.draw else {
            return Err("this learner's batch sizes are fixed".into());
        };
        let total: u64 = uniform.iter().map(|&m| u64::from(m)).sum();
        for (e, row) in new.iter().enumerate() {
            let sum: u64 = row.iter().map(|&m| u64::from(m)).sum();
            if row.len() != uniform.len() || row.contains(&0) || sum != total {
                return Err(format!(
                    "epoch {e}'s batch sizes {row:?} are not {} sizes of at least 1 summing to {total}",
                    uniform.len()
                ));
            }
            if sizes.get(e).is_some_and(|known| known != row) {
                return Err(format!("epoch {e}'s batch sizes were {:?}, now {row:?}", sizes[e]));
            }
        }
        if new.len() > sizes.len() {
            sizes.extend_from_slice(&new[sizes.len()..]);
        }
        Ok(())
    }

    fn reshuffle(&mut self) {
        let mix = |stream: u64| {
            self.seed
                ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ self.epoch.wrapping_mul(0xD1B5_4A32_D192_ED03)
        };
        match &self.draw {
            Draw::Fixed(partition) => {
                self.order.clone_from(&partition.indices);
                self.order.shuffle(&mut ChaCha8Rng::seed_from_u64(mix(self.stream)));
            }
            Draw::Planned { examples, .. } => {
                // One permutation per epoch, the same at every learner (stream 0's mix).
                self.order.clear();
                self.order.extend(0..*examples as u32);
                self.order.shuffle(&mut ChaCha8Rng::seed_from_u64(mix(0)));
            }
        }
        self.pos = 0;
    }

    /// Full batches per epoch.
    #[must_use]
    pub fn batches_per_epoch(&self) -> usize {
        match &self.draw {
            Draw::Fixed(partition) => partition.len() / self.batch,
            Draw::Planned { steps, .. } => *steps,
        }
    }

    /// The epoch the next batch belongs to.
    #[must_use]
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The epoch and step within it of the next batch.
    fn next_step(&self) -> (u64, usize) {
        let steps = self.batches_per_epoch();
        match &self.draw {
            Draw::Fixed(_) if self.pos + self.batch > self.order.len() => (self.epoch + 1, 0),
            Draw::Planned { .. } if self.pos >= steps => (self.epoch + 1, 0),
            _ => (self.epoch, self.pos),
        }
    }

    /// Adaptive batch sizes: every learner's size at `step` of `epoch`, if chosen yet.
    fn sizes_at(&self, epoch: u64, step: usize) -> Option<&[u32]> {
        match &self.draw {
            Draw::Fixed(_) => None,
            Draw::Planned { warmup, uniform, .. } if epoch == 0 && step < *warmup => Some(uniform),
            Draw::Planned { sizes, .. } => sizes.get(epoch as usize).map(Vec::as_slice),
        }
    }

    /// Whether the next batch can be drawn: with adaptive batch sizes, not before its
    /// epoch's sizes are known.
    #[must_use]
    pub fn ready(&self) -> bool {
        let (epoch, step) = self.next_step();
        matches!(self.draw, Draw::Fixed(_)) || self.sizes_at(epoch, step).is_some()
    }

    /// The indices of the next minibatch. Returns an empty slice for a partition smaller than
    /// one batch, or when the stream is not [`Self::ready`].
    pub fn next_batch(&mut self) -> &[u32] {
        if self.batches_per_epoch() == 0 || !self.ready() {
            return &[];
        }
        let (epoch, step) = self.next_step();
        if epoch != self.epoch {
            self.epoch = epoch;
            self.reshuffle();
        }
        let l = self.stream as usize;
        let planned = self.sizes_at(epoch, step).map(|row| {
            let total: usize = row.iter().map(|&m| m as usize).sum();
            let start = step * total + row[..l].iter().map(|&m| m as usize).sum::<usize>();
            start..start + row[l] as usize
        });
        let range = match planned {
            Some(range) => {
                self.pos += 1;
                range
            }
            None => {
                self.pos += self.batch;
                self.pos - self.batch..self.pos
            }
        };
        &self.order[range]
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

    /// Whether the next minibatch can be drawn ([`BatchStream::ready`]).
    #[must_use]
    pub fn ready(&self) -> bool {
        self.prepared || self.stream.ready()
    }

    /// Adaptive batch sizes: see [`BatchStream::set_sizes`].
    pub fn set_sizes(&mut self, sizes: &[Vec<u32>]) -> Result<(), String> {
        self.stream.set_sizes(sizes)
    }

    /// Gather the next minibatch now (while a learner waits for its weights, say), so that
    /// [`Self::next_batch`] hands it over at once. Preparing twice prepares one minibatch; a
    /// stream not [`Self::ready`] prepares nothing.
    pub fn prepare(&mut self) {
        if !self.prepared && self.stream.ready() {
            self.indices.clear();
            self.indices.extend_from_slice(self.stream.next_batch());
            self.data.gather(&self.indices, &mut self.x, &mut self.y);
            self.prepared = true;
        }
    }

    /// The next minibatch (empty when not [`Self::ready`]).
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

    #[test]
    fn adaptive_sizes_use_every_example_once_per_epoch_whatever_the_sizes() {
        // μ = 4, λ = 3, 20 steps an epoch: epoch 0 at μ for its warm-up of 16 steps, then at
        // its chosen sizes; the next epochs at theirs.
        let (n, learners, mu) = (240, 3, 4);
        let mut streams: Vec<BatchStream> =
            (0..learners).map(|l| BatchStream::adaptive(n, learners, mu, 5, l)).collect();
        assert!(streams.iter().all(|s| s.batches_per_epoch() == 20));
        let sizes = vec![vec![6, 4, 2], vec![4, 4, 4], vec![1, 1, 10]];
        for (epoch, row) in sizes.iter().enumerate() {
            let mut seen = HashSet::new();
            for (l, s) in streams.iter_mut().enumerate() {
                for step in 0..20 {
                    if epoch == 0 && step == ADAPTIVE_WARMUP_STEPS {
                        assert!(
                            !s.ready() && s.next_batch().is_empty(),
                            "it waits for the sizes, drawing nothing"
                        );
                        s.set_sizes(&sizes[..1]).unwrap();
                    }
                    let want = if epoch == 0 && step < ADAPTIVE_WARMUP_STEPS { mu } else { row[l] as usize };
                    let batch = s.next_batch().to_vec();
                    assert_eq!(batch.len(), want, "epoch {epoch}, learner {l}, step {step}");
                    assert!(batch.iter().all(|&i| seen.insert(i)), "an example twice in epoch {epoch}");
                    assert_eq!(s.epoch(), epoch as u64);
                }
                if epoch == 0 {
                    assert!(!s.ready(), "epoch 1's sizes are not known yet");
                    s.set_sizes(&sizes).unwrap();
                }
            }
            assert_eq!(seen.len(), n, "every example once in epoch {epoch}");
        }
        let mut s = BatchStream::adaptive(n, learners, mu, 5, 0);
        for bad in [vec![vec![5, 4, 4]], vec![vec![4, 4, 4], vec![12, 0, 0]], vec![vec![4, 8]]] {
            assert!(s.set_sizes(&bad).is_err(), "{bad:?}");
        }
        s.set_sizes(&sizes[..2]).unwrap();
        assert!(s.set_sizes(&[sizes[0].clone(), sizes[2].clone()]).is_err(), "an epoch's sizes never change");
        assert!(BatchStream::new(Partition::split(10, 1, 0).remove(0), 2, 0, 0).set_sizes(&sizes).is_err());
    }
}
