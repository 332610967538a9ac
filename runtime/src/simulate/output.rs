//! What a simulation reports, and the files it writes: `summary.json`, `staleness.csv`,
//! `shards.csv`, `learners.csv`, `loss.csv` (and `checkpoint.safetensors` for a model), and
//! for a sweep `sweep.csv`.

use std::fmt::Write as _;

use rudra_actors::goodput::{LearnerTime, goodput};
use rudra_actors::{Diverged, ElasticMethod, RunReport};
use rudra_proto::StalenessSummary;
use rudra_proto::{DIVERGENCE_FACTOR, sync_easgd_is_stable};
use serde::Serialize;

use super::driver::{EventCounts, LearnerReport, LossRow, ShardReport};
use super::settings::GradientSource;
use crate::{Config, RunDir, RuntimeError, Summary};

/// Final loss below this fraction of the initial loss: converged.
const CONVERGED: f64 = 1e-4;
/// Final loss above this multiple of the initial loss, or not finite: diverged.
const DIVERGED: f64 = 1e4;

/// The outcome of one simulation.
#[derive(Clone, Debug)]
pub struct SimReport {
    /// The protocol that ran: `protocol.kind` (`hardsync`, `softsync`, `async`, `easgd`,
    /// `eamsgd`, `downpour`, `mdownpour`), `easgd-sync` for sync EASGD.
    pub protocol: String,
    /// Virtual seconds simulated.
    pub virtual_seconds: f64,
    /// Wall-clock seconds the simulation took.
    pub wall_seconds: f64,
    /// Updates applied by the shard that applied the most.
    pub updates: u64,
    /// What happened, counted.
    pub counts: EventCounts,
    /// Staleness over all shards' gradients.
    pub staleness: StalenessSummary,
    /// Per-shard statistics.
    pub shards: Vec<ShardReport>,
    /// Per-learner time.
    pub learners: Vec<LearnerReport>,
    /// Loss over virtual time.
    pub loss: Vec<LossRow>,
    /// Hash of the ordered event log and the final parameters.
    pub trace_hash: u64,
    /// The final parameters (the shards' values).
    pub params: Vec<f32>,
    /// Test loss and accuracy at the end (model gradients only).
    pub test: Option<(f64, f64)>,
    /// Payload bytes each shard received.
    pub shard_payload_in: Vec<u64>,
}

/// Whether the objective went to its minimum, blew up, or neither.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Trend {
    /// Final loss below 1e-4 of the initial loss.
    Converged,
    /// Final loss above 1e4 times the initial loss, or not finite.
    Diverged,
    /// In between.
    Undecided,
}

impl SimReport {
    /// Updates per virtual second.
    #[must_use]
    pub fn updates_per_virtual_second(&self) -> f64 {
        self.updates as f64 / self.virtual_seconds.max(1e-12)
    }

    /// Gradients per virtual second.
    #[must_use]
    pub fn gradients_per_virtual_second(&self) -> f64 {
        self.counts.gradients as f64 / self.virtual_seconds.max(1e-12)
    }

    /// Events processed per wall-clock second.
    #[must_use]
    pub fn events_per_wall_second(&self) -> f64 {
        self.counts.processed as f64 / self.wall_seconds.max(1e-12)
    }

    /// Mean utilisation of the learners (computing / all).
    #[must_use]
    pub fn utilisation(&self) -> f64 {
        self.learners.iter().map(|l| l.utilisation).sum::<f64>() / self.learners.len().max(1) as f64
    }

    /// Fraction of applied gradients with σ above `bound`.
    #[must_use]
    pub fn fraction_above(&self, bound: u64) -> f64 {
        let h = &self.staleness.histogram;
        let above: u64 = h.iter().skip(usize::try_from(bound).unwrap_or(usize::MAX).saturating_add(1)).sum();
        above as f64 / self.staleness.applied.max(1) as f64
    }

    /// The first and last loss of `loss.csv`.
    #[must_use]
    pub fn loss_span(&self) -> (f64, f64) {
        let first = self.loss.first().map_or(f64::NAN, |r| r.loss);
        (first, self.loss.last().map_or(f64::NAN, |r| r.loss))
    }

    /// Where the run diverged by the rule real runs follow (a loss that is not finite, or
    /// above ten times the first row's), if it did.
    #[must_use]
    pub fn diverged(&self) -> Option<Diverged> {
        let first = self.loss.first()?.loss;
        (self.loss.iter())
            .find(|r| !r.loss.is_finite() || r.loss > DIVERGENCE_FACTOR * first)
            .map(|r| Diverged { update: r.updates, train_loss: r.loss, first_loss: first })
    }

    /// Whether the loss converged or diverged, judged on the first and last rows.
    #[must_use]
    pub fn trend(&self) -> Trend {
        let (first, last) = self.loss_span();
        if !last.is_finite() || last > DIVERGED * first {
            Trend::Diverged
        } else if last < CONVERGED * first {
            Trend::Converged
        } else {
            Trend::Undecided
        }
    }
}

/// `summary.json` of a simulation: the keys of a real run's summary, then the simulator's.
#[derive(Clone, Debug, Serialize)]
pub struct SimSummary {
    /// The keys every run writes. `wall_seconds` and `samples_per_second` are wall-clock
    /// figures; `samples` counts μ per gradient.
    #[serde(flatten)]
    pub run: Summary,
    /// `synthetic` or `model`.
    pub gradient_source: String,
    /// `simulation.seed`.
    pub seed: u64,
    /// Virtual seconds simulated.
    pub virtual_seconds: f64,
    /// Gradients computed.
    pub gradients: u64,
    /// Updates per virtual second.
    pub updates_per_virtual_second: f64,
    /// Gradients per virtual second.
    pub gradients_per_virtual_second: f64,
    /// Fraction of applied gradients with σ > 2n (softsync and async).
    pub fraction_above_2n: Option<f64>,
    /// Mean learner utilisation (computing / all).
    pub utilisation: f64,
    /// Learners that are stragglers.
    pub stragglers: usize,
    /// The first and last loss of `loss.csv`.
    pub initial_loss: f64,
    /// See `initial_loss`.
    pub final_loss: f64,
    /// Converged, diverged or undecided, judged on the first and last loss (synthetic
    /// gradients, whose objective is exact).
    pub trend: Option<Trend>,
    /// Sync EASGD with τ = 1 and constant η on the quadratic: whether the stability
    /// conditions predict convergence.
    pub predicted_stable: Option<bool>,
    /// Per-shard ⟨σ⟩, max σ and counts.
    pub shards: Vec<ShardReport>,
    /// Events of each kind.
    pub events: EventCounts,
    /// Events processed per wall-clock second.
    pub events_per_wall_second: f64,
    /// FNV-1a hash of the ordered event log and the final parameters, 16 hex digits.
    pub trace_hash: String,
}

impl SimSummary {
    /// The summary of `report`, a simulation of `config`.
    #[must_use]
    pub fn new(config: &Config, report: &SimReport) -> Self {
        let c = &config.cluster;
        let samples = report.counts.gradients * c.batch_size as u64;
        let (initial_loss, final_loss) = report.loss_span();
        let learner_time: Vec<LearnerTime> = (report.learners.iter())
            .map(|l| LearnerTime {
                compute_seconds: l.compute_seconds,
                wait_seconds: l.wait_seconds,
                applied: l.applied,
                dropped: l.dropped,
                lost_seconds: l.lost_seconds,
            })
            .collect();
        let run = RunReport {
            batch_sizes: Vec::new(),
            shard_payload_in: report.shard_payload_in.clone(),
            timeline: Vec::new(),
            updates_lost: 0,
            metrics: Vec::new(),
            params: Vec::new(),
            staleness: report.staleness.clone(),
            updates: report.updates,
            samples,
            samples_expected: 0,
            learner_samples: Vec::new(),
            wall_seconds: report.wall_seconds,
            final_test_accuracy: report.test.map_or(f64::NAN, |t| t.1),
            final_train_loss: final_loss,
            diverged: report.diverged(),
            bytes: rudra_actors::BytesMoved {
                steps: report.counts.gradients,
                payload: report.counts.payload_up_bytes + report.counts.payload_down_bytes,
                payload_up: report.counts.payload_up_bytes,
                payload_down: report.counts.payload_down_bytes,
                wire: report.counts.bytes,
            },
            goodput: goodput(&learner_time),
            learner_time,
        };
        let mut run = Summary::new(config, &run);
        run.protocol.clone_from(&report.protocol);
        let synthetic = match config.simulation.gradients {
            GradientSource::Synthetic(q) => Some(q),
            GradientSource::Model => None,
        };
        if synthetic.is_some() {
            run.model = "quadratic".into();
        }
        let elastic = c.protocol.elastic();
        // The conditions are those of sync EASGD with an exchange every step and a constant η.
        let analysed = elastic.filter(|e| {
            e.method == ElasticMethod::Easgd { sync: true } && e.tau == 1 && e.lr_decay_gamma == 0.0
        });
        let predicted_stable = synthetic.zip(analysed).map(|(q, e)| {
            let eta_h = f64::from(c.schedule.base) * f64::from(q.curvature);
            sync_easgd_is_stable(eta_h, f64::from(e.alpha), f64::from(e.beta))
        });
        Self {
            fraction_above_2n: (elastic.is_none() && run.n > 0)
                .then(|| report.fraction_above(2 * u64::from(run.n))),
            run,
            gradient_source: if synthetic.is_some() { "synthetic" } else { "model" }.into(),
            seed: config.simulation.seed,
            virtual_seconds: report.virtual_seconds,
            gradients: report.counts.gradients,
            updates_per_virtual_second: report.updates_per_virtual_second(),
            gradients_per_virtual_second: report.gradients_per_virtual_second(),
            utilisation: report.utilisation(),
            stragglers: report.learners.iter().filter(|l| l.straggler).count(),
            initial_loss,
            final_loss,
            trend: synthetic.map(|_| report.trend()),
            predicted_stable,
            shards: report.shards.clone(),
            events: report.counts.clone(),
            events_per_wall_second: report.events_per_wall_second(),
            trace_hash: format!("{:016x}", report.trace_hash),
        }
    }

    /// One line for the terminal.
    #[must_use]
    pub fn headline(&self) -> String {
        let s = &self.run;
        format!(
            "{} n={} λ={}: ⟨σ⟩ {:.3} (max {}), {} gradients, {} updates in {:.2} virtual s \
             ({:.1} updates/s), utilisation {:.3}, {:.1} MB sent (peak {:.2} MB in flight), \
             loss {:.4e} → {:.4e}; {} events in {:.2} s ({:.0} events/s); trace {}",
            s.protocol,
            s.n,
            s.learners,
            s.staleness.mean,
            s.staleness.max,
            self.gradients,
            s.updates,
            self.virtual_seconds,
            self.updates_per_virtual_second,
            self.utilisation,
            self.events.bytes as f64 / 1e6,
            self.events.peak_bytes_in_flight as f64 / 1e6,
            self.initial_loss,
            self.final_loss,
            self.events.processed,
            s.wall_seconds,
            self.events_per_wall_second,
            self.trace_hash
        )
    }
}

/// A float for a CSV file: plain, or in scientific notation when very small or large.
fn num(v: f64) -> String {
    if v != 0.0 && v.is_finite() && !(1e-4..1e9).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        v.to_string()
    }
}

fn csv<T>(header: &str, rows: &[T], row: impl Fn(&T) -> String) -> String {
    let mut out = format!("{header}\n");
    for r in rows {
        let _ = writeln!(out, "{}", row(r));
    }
    out
}

/// Write `report`, a simulation of `config`, into `dir`.
pub fn write_run(dir: &RunDir, config: &Config, report: &SimReport) -> Result<SimSummary, RuntimeError> {
    let summary = SimSummary::new(config, report);
    let json = serde_json::to_string_pretty(&summary).map_err(|e| RuntimeError::Config(e.to_string()))?;
    dir.write_file("summary.json", &json)?;
    let histogram: Vec<(usize, u64)> = report.staleness.histogram.iter().copied().enumerate().collect();
    dir.write_file("staleness.csv", &csv("staleness,gradients", &histogram, |(s, n)| format!("{s},{n}")))?;
    let shards = csv("shard,updates,applied,dropped,mean_staleness,max_staleness", &report.shards, |s| {
        format!(
            "{},{},{},{},{},{}",
            s.shard, s.updates, s.applied, s.dropped, s.mean_staleness, s.max_staleness
        )
    });
    dir.write_file("shards.csv", &shards)?;
    let learners = csv(
        "learner,straggler,gradients,compute_seconds,wait_seconds,lost_seconds,utilisation",
        &report.learners,
        |l| {
            format!(
                "{},{},{},{},{},{},{}",
                l.learner,
                l.straggler,
                l.gradients,
                l.compute_seconds,
                l.wait_seconds,
                l.lost_seconds,
                l.utilisation
            )
        },
    );
    dir.write_file("learners.csv", &learners)?;
    let loss = csv("virtual_seconds,gradients,updates,loss", &report.loss, |r| {
        format!("{},{},{},{}", r.virtual_seconds, r.gradients, r.updates, num(r.loss))
    });
    dir.write_file("loss.csv", &loss)?;
    if config.simulation.gradients == GradientSource::Model {
        dir.write_checkpoint(config, &report.params)?;
    }
    Ok(summary)
}

/// A swept value as a CSV cell: a TOML string without its quotes, quoted if it needs to be.
fn cell(literal: &str) -> String {
    let plain = literal.trim_matches('"');
    if plain.contains([',', '"']) { format!("\"{}\"", plain.replace('"', "\"\"")) } else { plain.to_owned() }
}

/// `sweep.csv`: one row per point, the swept values first.
#[must_use]
pub fn sweep_csv(keys: &[String], points: &[(Vec<String>, SimSummary)]) -> String {
    let header = format!(
        "point,{},protocol,mean_staleness,max_staleness,fraction_above_2n,gradients_per_virtual_second,\
         updates_per_virtual_second,utilisation,initial_loss,final_loss,trend,outcome,predicted_stable,agrees,trace_hash,\
         bytes_sent,peak_bytes_in_flight,test_accuracy",
        keys.join(",")
    );
    let opt = |v: Option<String>| v.unwrap_or_default();
    csv(&header, &points.iter().enumerate().collect::<Vec<_>>(), |(i, (sets, s))| {
        let values: Vec<String> =
            sets.iter().map(|a| cell(a.split_once('=').map_or("", |(_, v)| v))).collect();
        let trend = s.trend.map(|t| {
            serde_json::to_value(t).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
        });
        let agrees = s.predicted_stable.zip(s.trend).and_then(|(p, t)| match t {
            Trend::Undecided => None,
            t => Some((t == Trend::Converged) == p),
        });
        format!(
            "{i},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            values.join(","),
            s.run.protocol,
            s.run.staleness.mean,
            s.run.staleness.max,
            opt(s.fraction_above_2n.map(|f| f.to_string())),
            s.gradients_per_virtual_second,
            s.updates_per_virtual_second,
            s.utilisation,
            num(s.initial_loss),
            num(s.final_loss),
            opt(trend),
            s.run.outcome,
            opt(s.predicted_stable.map(|p| p.to_string())),
            opt(agrees.map(|a| a.to_string())),
            s.trace_hash,
            s.events.bytes,
            s.events.peak_bytes_in_flight,
            num(s.run.final_test_accuracy),
        )
    })
}
