//! Live metrics of a node, rendered in the Prometheus text exposition format.
//!
//! [`Metrics`] is a small registry shared by the actors of one node. Series are created once
//! (a `DashMap` from metric and label to an atomic) and the actors keep handles to them, so
//! recording a gradient or an update is a few atomic additions and takes no lock. Whoever
//! serves the node's `/metrics` calls [`Metrics::render`], which reads every value once and
//! encodes them with the Prometheus project's Rust client (`prometheus-client`) as a
//! collector of constant metrics.
//!
//! ```
//! use std::sync::Arc;
//! use rudra_actors::metrics::Metrics;
//! use rudra_transport::ShardId;
//!
//! let metrics = Arc::new(Metrics::new());
//! let shard = metrics.shard(ShardId(0)); // give this to a `ShardActor`
//! assert!(metrics.render().contains("rudra_shard_clock{shard=\"0\"} 0"));
//! # drop(shard);
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Instant;

use dashmap::DashMap;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeGaugeValue, EncodeMetric, NoLabelSet, prometheus_text,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use rudra_transport::quic::Traffic;
use rudra_transport::{Clock, LearnerId, ShardId};

use crate::goodput::{LearnerTime, goodput};
use rudra_proto::{DropReason, GradientRecord, Outcome, UpdateRecord};

/// Upper bounds (`le`) of the staleness histogram's buckets, in updates; `+Inf` follows.
pub const STALENESS_BUCKETS: [u64; 10] = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256];

/// A labelled metric family kept in the registry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Family {
    ShardClock,
    GradientsApplied,
    GradientsDropped,
    GradientsNonFinite,
    LearnerSamples,
}

impl Family {
    /// Name (a counter's without the `_total` the encoder appends), type, help text and label.
    fn describe(self) -> (&'static str, MetricType, &'static str, &'static str) {
        match self {
            Self::ShardClock => (
                "rudra_shard_clock",
                MetricType::Gauge,
                "Updates applied by the shard so far: the clock of its weights.",
                "shard",
            ),
            Self::GradientsApplied => {
                ("rudra_gradients_applied", MetricType::Counter, "Gradients the shard applied.", "shard")
            }
            Self::GradientsDropped => (
                "rudra_gradients_dropped",
                MetricType::Counter,
                "Gradients the shard dropped (too stale, of a past round, rolled back, lapsed, non-finite).",
                "shard",
            ),
            Self::GradientsNonFinite => (
                "rudra_gradients_non_finite",
                MetricType::Counter,
                "Gradients (or exchanges) the shard dropped for holding NaN or ±Inf.",
                "shard",
            ),
            Self::LearnerSamples => (
                "rudra_learner_samples",
                MetricType::Counter,
                "Training examples the learner processed.",
                "learner",
            ),
        }
    }
}

/// Applied gradients counted by staleness bucket; the count and sum follow from them.
#[derive(Debug, Default)]
struct Histogram {
    /// `buckets[i]`: gradients with σ ≤ `STALENESS_BUCKETS[i]` and above the bucket before;
    /// the last one counts everything above the largest bound.
    buckets: [AtomicU64; STALENESS_BUCKETS.len() + 1],
    sum: AtomicU64,
}

impl Histogram {
    fn observe(&self, sigma: u64) {
        let i = STALENESS_BUCKETS.partition_point(|&le| le < sigma);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(sigma, Ordering::Relaxed);
    }
}

/// The metrics registry of one node. Share it as an `Arc`; see the [module docs](self).
#[derive(Debug)]
pub struct Metrics {
    series: DashMap<(Family, u32), Arc<AtomicU64>>,
    staleness: Histogram,
    learners_alive: AtomicU64,
    /// Each learner's time and the run's goodput at the last evaluation.
    learner_time: Mutex<Vec<LearnerTime>>,
    /// When the first update was recorded, and the clock it brought.
    first_update: OnceLock<(Instant, u64)>,
    /// The node's QUIC endpoints, read only when rendering.
    traffic: Mutex<Vec<Arc<Traffic>>>,
    /// Payload bytes the learners reported sending (up) and receiving (down).
    payload: [AtomicU64; 2],
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// An empty registry.
    #[must_use]
    pub fn new() -> Self {
        Self {
            series: DashMap::new(),
            staleness: Histogram::default(),
            learners_alive: AtomicU64::new(0),
            learner_time: Mutex::new(Vec::new()),
            first_update: OnceLock::new(),
            traffic: Mutex::new(Vec::new()),
            payload: [AtomicU64::new(0), AtomicU64::new(0)],
        }
    }

    fn series(&self, family: Family, label: u32) -> Arc<AtomicU64> {
        Arc::clone(&self.series.entry((family, label)).or_default())
    }

    /// The handle through which shard `id` records its gradients and updates.
    #[must_use]
    pub fn shard(self: &Arc<Self>, id: ShardId) -> ShardMetrics {
        ShardMetrics {
            registry: Arc::clone(self),
            clock: self.series(Family::ShardClock, id.0),
            applied: self.series(Family::GradientsApplied, id.0),
            dropped: self.series(Family::GradientsDropped, id.0),
            non_finite: self.series(Family::GradientsNonFinite, id.0),
        }
    }

    /// Record a batch of shard records (the staleness tracker's input), looking each shard's
    /// handle up once per run of records from the same shard.
    pub fn record(self: &Arc<Self>, gradients: &[GradientRecord], updates: &[UpdateRecord]) {
        for run in gradients.chunk_by(|a, b| a.shard == b.shard) {
            let shard = self.shard(run[0].shard);
            run.iter().for_each(|g| shard.record_gradient(g));
        }
        for run in updates.chunk_by(|a, b| a.shard == b.shard) {
            let shard = self.shard(run[0].shard);
            run.iter().for_each(|u| shard.record_update(u));
        }
    }

    /// Set the number of learners alive (joined and not finished, or connected).
    pub fn set_learners_alive(&self, n: usize) {
        self.learners_alive.store(n as u64, Ordering::Relaxed);
    }

    /// Count a learner as alive until the returned guard is dropped (a connection's lifetime).
    #[must_use]
    pub fn learner_connected(self: &Arc<Self>) -> AliveGuard {
        self.learners_alive.fetch_add(1, Ordering::Relaxed);
        AliveGuard(Arc::clone(self))
    }

    /// `learner` processed `samples` more training examples.
    pub fn add_learner_samples(&self, learner: LearnerId, samples: u64) {
        self.series(Family::LearnerSamples, learner.0).fetch_add(samples, Ordering::Relaxed);
    }

    /// Each learner's time at the latest evaluation, by learner id (goodput follows from it).
    pub fn set_learner_time(&self, learners: &[LearnerTime]) {
        learners.clone_into(&mut self.learner_time.lock().unwrap_or_else(PoisonError::into_inner));
    }

    /// The learners sent `up` and received `down` more payload bytes (values and scales, as
    /// encoded).
    pub fn add_payload_bytes(&self, up: u64, down: u64) {
        self.payload[0].fetch_add(up, Ordering::Relaxed);
        self.payload[1].fetch_add(down, Ordering::Relaxed);
    }

    /// Report the bytes of a QUIC endpoint of this node (summed over all endpoints watched).
    pub fn watch_traffic(&self, traffic: Arc<Traffic>) {
        self.traffic.lock().unwrap_or_else(PoisonError::into_inner).push(traffic);
    }

    /// Every metric in the Prometheus text exposition format (version 0.0.4, see
    /// [`CONTENT_TYPE`]), encoded by the Prometheus project's client library from the values
    /// read at this moment.
    #[must_use]
    pub fn render(&self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self.read()));
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_text::encode(&mut out, &registry);
        out
    }

    /// The values of every series, read once.
    fn read(&self) -> Reading {
        let mut series: Vec<((Family, u32), u64)> =
            self.series.iter().map(|e| (*e.key(), e.value().load(Ordering::Acquire))).collect();
        series.sort_unstable();
        // Read after the applied counters: a shard counts σ before it counts the gradient, so
        // the histogram holds at least every gradient counted above.
        let buckets = self.staleness.buckets.each_ref().map(|b| b.load(Ordering::Relaxed));
        let sum = self.staleness.sum.load(Ordering::Relaxed);
        let updates =
            series.iter().filter(|((f, _), _)| *f == Family::ShardClock).map(|(_, v)| *v).max().unwrap_or(0);
        let updates_per_second = self.first_update.get().map_or(0.0, |(at, first)| {
            let secs = at.elapsed().as_secs_f64();
            if secs > 0.0 { updates.saturating_sub(*first) as f64 / secs } else { 0.0 }
        });
        let traffic = self
            .traffic
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .fold((0, 0), |(s, r), t| (s + t.sent(), r + t.received()));
        Reading {
            series,
            buckets,
            sum,
            updates_per_second,
            learners_alive: self.learners_alive.load(Ordering::Relaxed),
            learner_time: self.learner_time.lock().unwrap_or_else(PoisonError::into_inner).clone(),
            traffic,
            payload: self.payload.each_ref().map(|p| p.load(Ordering::Relaxed)),
        }
    }
}

/// The content type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Every value of a [`Metrics`] registry at one moment: what one scrape encodes.
#[derive(Debug)]
struct Reading {
    /// Labelled series, sorted by family and label.
    series: Vec<((Family, u32), u64)>,
    /// Staleness histogram buckets (not cumulative) and the sum of σ.
    buckets: [u64; STALENESS_BUCKETS.len() + 1],
    sum: u64,
    updates_per_second: f64,
    learners_alive: u64,
    learner_time: Vec<LearnerTime>,
    /// Frame bytes sent and received.
    traffic: (u64, u64),
    /// Payload bytes the learners reported sending and receiving.
    payload: [u64; 2],
}

impl Reading {
    /// `family`'s descriptor and its series, one per label value.
    fn labelled(&self, encoder: &mut DescriptorEncoder, family: Family) -> std::fmt::Result {
        let (name, kind, help, label) = family.describe();
        let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
        for ((_, id), value) in self.series.iter().filter(|((f, _), _)| *f == family) {
            let labels = [(label, id.to_string())];
            let series = metric.encode_family(&labels)?;
            match kind {
                MetricType::Counter => ConstCounter::new(*value).encode(series)?,
                _ => ConstGauge::new(*value).encode(series)?,
            }
        }
        Ok(())
    }
}

fn gauge<N: EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: N,
) -> std::fmt::Result {
    ConstGauge::new(value).encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

fn counter(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> std::fmt::Result {
    ConstCounter::new(value).encode(encoder.encode_descriptor(name, help, None, MetricType::Counter)?)
}

impl Collector for Reading {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let e = &mut encoder;
        for family in [
            Family::ShardClock,
            Family::GradientsApplied,
            Family::GradientsDropped,
            Family::GradientsNonFinite,
        ] {
            self.labelled(e, family)?;
        }
        let count: u64 = self.buckets.iter().sum();
        let bounds = STALENESS_BUCKETS.iter().map(|&le| le as f64).chain([f64::INFINITY]);
        let buckets: Vec<(f64, u64)> = bounds.zip(self.buckets).collect();
        let help = "Staleness σ of applied gradients, in updates.";
        e.encode_descriptor("rudra_staleness", help, None, MetricType::Histogram)?
            .encode_histogram::<NoLabelSet>(self.sum as f64, count, &buckets, None)?;
        let mean = if count == 0 { 0.0 } else { self.sum as f64 / count as f64 };
        gauge(e, "rudra_staleness_mean", "Mean staleness ⟨σ⟩ of applied gradients.", mean)?;
        gauge(
            e,
            "rudra_updates_per_second",
            "Updates per second of the most advanced shard since the first update seen.",
            self.updates_per_second,
        )?;
        gauge(
            e,
            "rudra_learners_alive",
            "Learners joined and not finished (scheduler), or connected (shard).",
            self.learners_alive,
        )?;
        self.labelled(e, Family::LearnerSamples)?;
        type Seconds = fn(&LearnerTime) -> f64;
        let seconds: [(&str, &str, Seconds); 2] = [
            (
                "rudra_learner_compute_seconds",
                "Seconds the learner spent computing gradients, at the latest evaluation (local, scheduler).",
                |t| t.compute_seconds,
            ),
            (
                "rudra_learner_wait_seconds",
                "The learner's other seconds in the run (waiting for weights, the network, its turn), at the latest evaluation (local, scheduler).",
                |t| t.wait_seconds,
            ),
        ];
        for (name, help, value) in seconds {
            let mut metric = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (l, t) in self.learner_time.iter().enumerate() {
                ConstGauge::new(value(t)).encode(metric.encode_family(&[("learner", l.to_string())])?)?;
            }
        }
        gauge(
            e,
            "rudra_goodput",
            "Learners' compute time that ended in applied contributions over all their time in the run, at the latest evaluation (local, scheduler).",
            goodput(&self.learner_time),
        )?;
        counter(e, "rudra_transport_sent_bytes", "Frame bytes this node sent over QUIC.", self.traffic.0)?;
        counter(
            e,
            "rudra_transport_received_bytes",
            "Frame bytes this node received over QUIC.",
            self.traffic.1,
        )?;
        counter(
            e,
            "rudra_payload_bytes",
            "Payload bytes (values and scales, as encoded) the learners sent and received.",
            self.payload[0] + self.payload[1],
        )?;
        counter(
            e,
            "rudra_payload_up_bytes",
            "Payload bytes the learners sent: gradients, and the elastic family's exchanges.",
            self.payload[0],
        )?;
        counter(
            e,
            "rudra_payload_down_bytes",
            "Payload bytes the learners received: weights and centers.",
            self.payload[1],
        )
    }
}

/// Keeps a learner counted in `rudra_learners_alive` while it lives.
#[derive(Debug)]
pub struct AliveGuard(Arc<Metrics>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.learners_alive.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One shard's series: what a [`crate::shard::ShardActor`] updates for every gradient and
/// update, with atomics only.
#[derive(Clone, Debug)]
pub struct ShardMetrics {
    registry: Arc<Metrics>,
    clock: Arc<AtomicU64>,
    applied: Arc<AtomicU64>,
    dropped: Arc<AtomicU64>,
    non_finite: Arc<AtomicU64>,
}

impl ShardMetrics {
    /// Count a gradient applied or dropped.
    pub fn record_gradient(&self, g: &GradientRecord) {
        match g.outcome {
            Outcome::Applied { .. } => {
                self.registry.staleness.observe(g.staleness.0);
                // Release: whoever reads this count also sees the σ observed above.
                self.applied.fetch_add(1, Ordering::Release);
            }
            Outcome::Dropped(reason) => {
                if reason == DropReason::NonFinite {
                    self.non_finite.fetch_add(1, Ordering::Relaxed);
                }
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Note the shard's clock after an update.
    pub fn record_update(&self, u: &UpdateRecord) {
        let Clock(clock) = u.clock;
        self.registry.first_update.get_or_init(|| (Instant::now(), clock));
        // Release: whoever reads this clock also sees the gradients counted before it.
        self.clock.fetch_max(clock, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use rudra_transport::Staleness;

    use super::*;

    fn gradient(shard: u32, sigma: u64, outcome: Outcome) -> GradientRecord {
        GradientRecord {
            shard: ShardId(shard),
            learner: LearnerId(0),
            computed_on: Clock(0),
            staleness: Staleness(sigma),
            outcome,
        }
    }

    #[test]
    fn records_render_as_counters_gauges_and_a_cumulative_histogram() {
        let m = Arc::new(Metrics::new());
        let applied = Outcome::Applied { alpha: 0.1 };
        let gradients = [
            gradient(0, 0, applied),
            gradient(0, 3, applied),
            gradient(1, 300, applied),
            gradient(1, 9, Outcome::Dropped(DropReason::TooStale)),
        ];
        let updates = [
            UpdateRecord { shard: ShardId(0), clock: Clock(1), gradients: 2, payload_in: 0 },
            UpdateRecord { shard: ShardId(1), clock: Clock(1), gradients: 1, payload_in: 0 },
        ];
        m.record(&gradients, &updates);
        m.set_learners_alive(3);
        let guard = m.learner_connected();
        m.add_learner_samples(LearnerId(1), 64);
        m.add_learner_samples(LearnerId(1), 32);
        let time = |compute_seconds, wait_seconds, applied| LearnerTime {
            compute_seconds,
            wait_seconds,
            applied,
            dropped: 0,
            lost_seconds: 0.0,
        };
        m.set_learner_time(&[time(3.0, 1.0, 4), time(1.5, 2.5, 0)]);
        let text = m.render();
        for line in [
            "# TYPE rudra_shard_clock gauge",
            "rudra_shard_clock{shard=\"1\"} 1",
            "rudra_gradients_applied_total{shard=\"0\"} 2",
            "rudra_gradients_applied_total{shard=\"1\"} 1",
            "rudra_gradients_dropped_total{shard=\"1\"} 1",
            "# TYPE rudra_staleness histogram",
            "rudra_staleness_bucket{le=\"0\"} 1",
            "rudra_staleness_bucket{le=\"2\"} 1",
            "rudra_staleness_bucket{le=\"4\"} 2",
            "rudra_staleness_bucket{le=\"256\"} 2",
            "rudra_staleness_bucket{le=\"+Inf\"} 3",
            "rudra_staleness_sum 303.0",
            "rudra_staleness_count 3",
            "rudra_staleness_mean 101.0",
            "rudra_learners_alive 4",
            "rudra_learner_samples_total{learner=\"1\"} 96",
            "rudra_transport_sent_bytes_total 0",
            "rudra_learner_compute_seconds{learner=\"0\"} 3.0",
            "rudra_learner_wait_seconds{learner=\"1\"} 2.5",
            "rudra_goodput 0.375",
        ] {
            assert!(text.lines().any(|l| l == line), "no line {line:?} in\n{text}");
        }
        drop(guard);
        assert!(m.render().lines().any(|l| l == "rudra_learners_alive 3"));
    }
}
