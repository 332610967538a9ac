//! What the simulator assumes about time: how long a learner computes a gradient (a
//! distribution, with stragglers), and how long a message travels (latency plus its encoded
//! size over the link's bandwidth, jitter, resends of lost messages; links deliver in order).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rudra_transport::{Clock, LearnerId, Msg, ShardId};

use super::events::{Nanos, nanos};
use super::settings::{ComputeDist, ComputeSpec, NetworkSpec};
use crate::RuntimeError;

/// A uniform draw in `[0, 1)`.
pub fn uniform(rng: &mut ChaCha8Rng) -> f64 {
    rng.random::<f64>()
}

/// Standard normal draws (Box–Muller, two per pair of uniforms) into `out`, times `scale`.
pub fn fill_normal(rng: &mut ChaCha8Rng, out: &mut [f32], scale: f32) {
    for pair in out.chunks_mut(2) {
        let (z0, z1) = normal_pair(rng);
        pair[0] = scale * z0 as f32;
        if let Some(second) = pair.get_mut(1) {
            *second = scale * z1 as f32;
        }
    }
}

fn normal_pair(rng: &mut ChaCha8Rng) -> (f64, f64) {
    let u1 = 1.0 - uniform(rng); // in (0, 1], so the logarithm is finite
    let u2 = uniform(rng);
    let r = (-2.0 * u1.ln()).sqrt();
    let (s, c) = (std::f64::consts::TAU * u2).sin_cos();
    (r * c, r * s)
}

/// Compute times of every learner.
pub struct ComputeModel {
    dist: ComputeDist,
    mean_ns: f64,
    /// Per learner: 1, or the straggler factor.
    factor: Vec<f64>,
}

impl ComputeModel {
    /// The model of `spec` for `learners` learners; the stragglers (the fraction rounded to
    /// the nearest count) are drawn from `rng`.
    pub fn new(spec: &ComputeSpec, learners: usize, rng: &mut ChaCha8Rng) -> Self {
        let stragglers = ((spec.straggler_fraction * learners as f64).round() as usize).min(learners);
        let mut order: Vec<usize> = (0..learners).collect();
        for i in 0..stragglers {
            let j = rng.random_range(i..learners);
            order.swap(i, j);
        }
        let mut factor = vec![1.0; learners];
        for &l in &order[..stragglers] {
            factor[l] = spec.straggler_factor;
        }
        Self { dist: spec.dist, mean_ns: spec.mean_seconds * 1e9, factor }
    }

    /// Whether learner `l` is a straggler.
    pub fn is_straggler(&self, l: usize) -> bool {
        self.factor[l] != 1.0
    }

    /// The time learner `l` takes for its next gradient (at least 1 ns).
    pub fn sample(&self, l: usize, rng: &mut ChaCha8Rng) -> Nanos {
        let unit = match self.dist {
            ComputeDist::Constant => 1.0,
            ComputeDist::Uniform { spread } => 1.0 + spread * (2.0 * uniform(rng) - 1.0),
            ComputeDist::LogNormal { sigma } => (sigma * normal_pair(rng).0 - sigma * sigma / 2.0).exp(),
        };
        ((self.mean_ns * self.factor[l] * unit).round() as Nanos).max(1)
    }
}

/// What a message carries, which fixes its size on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Payload {
    /// A pull request (learner → shard).
    Pull,
    /// A shard's range of values, learner → shard (a gradient, or x^i for an exchange).
    Up,
    /// A shard's range of values, shard → learner (weights, or the center).
    Down,
}

/// The link a message travels and what it carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// The learner at one end.
    pub learner: LearnerId,
    /// The shard at the other.
    pub shard: ShardId,
    /// What it carries; [`Payload::Down`] goes shard → learner, the others learner → shard.
    pub payload: Payload,
}

/// Message times on every learner–shard link, both directions.
pub struct Network {
    /// Latency plus size over bandwidth, per learner and shard (`learner * shards + shard`):
    /// (pull, values up, values down).
    transit: Vec<(Nanos, Nanos, Nanos)>,
    /// Frame bytes of the same three messages, per shard.
    sizes: Vec<(u64, u64, u64)>,
    /// Bytes of the values a shard's messages carry (f32).
    values: Vec<u64>,
    jitter: f64,
    drop_probability: f64,
    retransmit: Nanos,
    shards: usize,
    /// Arrival time of the latest message on each link and direction, so links stay in order.
    last: Vec<Nanos>,
    /// Seconds per byte into a shard (0: no limit), and when each shard's way in is next free.
    ingress: f64,
    ingress_free: Vec<Nanos>,
    /// Messages sent again after a loss.
    pub resent: u64,
    /// Frame bytes sent, every message counted once.
    pub bytes: u64,
    /// Bytes of values among them sent up, by the shard they went to …
    pub payload_in: Vec<u64>,
    /// … and sent down.
    payload_down: u64,
    /// The most bytes sent and not yet arrived at any one time.
    pub peak_in_flight: u64,
    /// Arrival times and sizes of the messages on their way.
    in_flight: BinaryHeap<Reverse<(Nanos, u64)>>,
    /// Their bytes.
    flying: u64,
}

impl Network {
    /// The network of `spec` between `learners` learners and shards holding `ranges` values
    /// each; message sizes are those of the encoded wire frames.
    pub fn new(spec: &NetworkSpec, learners: usize, ranges: &[usize]) -> Result<Self, RuntimeError> {
        let latency = |l: usize| match spec.learner_latency.as_slice() {
            [] => spec.latency,
            each => each[l % each.len()],
        };
        let time = |l: usize, bytes: u64| nanos(latency(l) + bytes as f64 / spec.bandwidth);
        let pull = Msg::Pull { learner: LearnerId(0), seq: 1, last: false }.encode()?.len() as u64;
        let sizes: Vec<(u64, u64, u64)> = ranges
            .iter()
            .map(|&len| {
                let up = Msg::Push {
                    learner: LearnerId(0),
                    seq: 1,
                    computed_on: Clock(0),
                    values: vec![0.0; len].into(),
                    examples: 1,
                    next_seq: 0,
                    last: false,
                }
                .encode()?
                .len();
                let down = Msg::Weights {
                    shard: ShardId(0),
                    learner: LearnerId(0),
                    seq: 1,
                    clock: Clock(0),
                    values: vec![0.0; len].into(),
                }
                .encode()?
                .len();
                Ok((pull, up as u64, down as u64))
            })
            .collect::<Result<_, RuntimeError>>()?;
        Ok(Self {
            transit: (0..learners)
                .flat_map(|l| sizes.iter().map(move |&(p, u, d)| (time(l, p), time(l, u), time(l, d))))
                .collect(),
            sizes,
            values: ranges.iter().map(|&len| 4 * len as u64).collect(),
            jitter: spec.jitter * 1e9,
            drop_probability: spec.drop_probability,
            retransmit: nanos(spec.retransmit_seconds),
            shards: ranges.len(),
            last: vec![0; learners * ranges.len() * 2],
            ingress: 1.0 / spec.shard_bandwidth,
            ingress_free: vec![0; ranges.len()],
            resent: 0,
            bytes: 0,
            payload_in: vec![0; ranges.len()],
            payload_down: 0,
            peak_in_flight: 0,
            in_flight: BinaryHeap::new(),
            flying: 0,
        })
    }

    /// Bytes of values sent by the learners (up) and to them (down).
    #[must_use]
    pub fn payload(&self) -> [u64; 2] {
        [self.payload_in.iter().sum(), self.payload_down]
    }

    /// When a message sent at `now` along `route` arrives.
    pub fn arrival(&mut self, now: Nanos, route: Route, rng: &mut ChaCha8Rng) -> Nanos {
        let s = route.shard.index();
        let pick = |(pull, up, down)| match route.payload {
            Payload::Pull => pull,
            Payload::Up => up,
            Payload::Down => down,
        };
        let mut at = now + pick(self.transit[route.learner.index() * self.shards + s]);
        let size = pick(self.sizes[s]);
        match route.payload {
            Payload::Pull => {}
            Payload::Up => self.payload_in[s] += self.values[s],
            Payload::Down => self.payload_down += self.values[s],
        }
        if self.jitter > 0.0 {
            at += (self.jitter * uniform(rng)) as Nanos;
        }
        if self.drop_probability > 0.0 {
            while uniform(rng) < self.drop_probability {
                at += self.retransmit;
                self.resent += 1;
            }
        }
        let down = usize::from(route.payload == Payload::Down);
        let link = &mut self.last[(route.learner.index() * self.shards + s) * 2 + down];
        *link = (*link).max(at);
        let mut at = *link;
        // What comes up, by whatever link, goes into the shard one message after another.
        if route.payload != Payload::Down && self.ingress > 0.0 {
            at = at.max(self.ingress_free[s] + nanos(size as f64 * self.ingress));
            self.ingress_free[s] = at;
        }
        self.count(now, at, size);
        at
    }

    /// A message of `size` bytes sent at `now` arrives `at`: count its bytes, and the bytes
    /// in flight now.
    fn count(&mut self, now: Nanos, at: Nanos, size: u64) {
        while let Some(&Reverse((arrival, bytes))) = self.in_flight.peek()
            && arrival <= now
        {
            self.in_flight.pop();
            self.flying -= bytes;
        }
        self.in_flight.push(Reverse((at, size)));
        self.flying += size;
        self.bytes += size;
        self.peak_in_flight = self.peak_in_flight.max(self.flying);
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    fn rng() -> ChaCha8Rng {
        ChaCha8Rng::seed_from_u64(3)
    }

    fn spec(dist: ComputeDist) -> ComputeSpec {
        ComputeSpec { dist, mean_seconds: 0.2, straggler_fraction: 0.1, straggler_factor: 4.0 }
    }

    fn mean_time(model: &ComputeModel, l: usize, rng: &mut ChaCha8Rng) -> f64 {
        (0..20_000).map(|_| model.sample(l, rng) as f64).sum::<f64>() / 20_000.0 / 1e9
    }

    #[test]
    fn compute_distributions_have_the_configured_mean_and_stragglers_are_slower() {
        let mut rng = rng();
        for dist in [
            ComputeDist::Constant,
            ComputeDist::Uniform { spread: 0.5 },
            ComputeDist::LogNormal { sigma: 0.5 },
        ] {
            let m = ComputeModel::new(&spec(dist), 30, &mut rng);
            assert_eq!((0..30).filter(|&l| m.is_straggler(l)).count(), 3);
            let normal = (0..30).find(|&l| !m.is_straggler(l)).unwrap();
            let slow = (0..30).find(|&l| m.is_straggler(l)).unwrap();
            let (a, b) = (mean_time(&m, normal, &mut rng), mean_time(&m, slow, &mut rng));
            assert!((a - 0.2).abs() < 0.005, "{dist:?}: mean {a}");
            assert!((b - 0.8).abs() < 0.02, "{dist:?}: straggler mean {b}");
        }
        let uniform = ComputeModel::new(&spec(ComputeDist::Uniform { spread: 0.5 }), 1, &mut rng);
        assert!(
            (0..1000).map(|_| uniform.sample(0, &mut rng)).all(|t| (100_000_000..=300_000_000).contains(&t))
        );
    }

    #[test]
    fn normal_draws_have_unit_variance() {
        let mut rng = rng();
        let mut z = vec![0.0; 100_001];
        fill_normal(&mut rng, &mut z, 2.0);
        let mean = z.iter().map(|&v| f64::from(v)).sum::<f64>() / z.len() as f64;
        let var = z.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / z.len() as f64;
        assert!(mean.abs() < 0.03 && (var - 4.0).abs() < 0.08, "mean {mean}, variance {var}");
    }

    #[test]
    fn messages_take_latency_plus_size_over_bandwidth_and_links_stay_in_order() {
        let spec = NetworkSpec {
            latency: 0.001,
            learner_latency: Vec::new(),
            bandwidth: 1e6,
            shard_bandwidth: f64::INFINITY,
            jitter: 0.0,
            drop_probability: 0.0,
            retransmit_seconds: 1.0,
        };
        let mut net = Network::new(&spec, 2, &[1000]).unwrap();
        let mut rng = rng();
        let route = |payload| Route { learner: LearnerId(0), shard: ShardId(0), payload };
        let up = net.arrival(0, route(Payload::Up), &mut rng);
        // 4000 bytes of values plus the frame: a little over 1 ms + 4 ms.
        assert!((5_000_000..5_200_000).contains(&up), "{up}");
        let pull = net.arrival(0, route(Payload::Pull), &mut rng);
        assert_eq!(pull, up, "a pull sent after a push does not overtake it");
        let other = net.arrival(0, Route { learner: LearnerId(1), ..route(Payload::Pull) }, &mut rng);
        assert!(other < 1_200_000, "another link is not held up: {other}");
        let (pull_bytes, up_bytes) = (net.sizes[0].0, net.sizes[0].1);
        assert!(up_bytes > 4000 && pull_bytes < 128, "{up_bytes} {pull_bytes}");
        assert_eq!(net.bytes, up_bytes + 2 * pull_bytes);
        assert_eq!(net.peak_in_flight, net.bytes, "all three on their way at once");
        // At 6 ms all three have arrived: the bytes in flight are the new message's alone.
        let _ = net.arrival(6_000_000, route(Payload::Up), &mut rng);
        assert_eq!(
            (net.bytes, net.peak_in_flight),
            (2 * up_bytes + 2 * pull_bytes, up_bytes + 2 * pull_bytes)
        );
        assert_eq!(net.flying, up_bytes);
        assert_eq!(net.payload(), [2 * 4000, 0], "the values of the two pushes");

        let lossy = NetworkSpec { drop_probability: 0.5, ..spec.clone() };
        let mut net = Network::new(&lossy, 1000, &[1]).unwrap();
        let late = (0..1000)
            .filter(|&l| {
                let r = Route { learner: LearnerId(l), ..route(Payload::Pull) };
                net.arrival(0, r, &mut rng) >= 1_000_000_000
            })
            .count();
        assert!((400..600).contains(&late), "about half the messages are resent: {late}");
        assert!(net.resent >= late as u64);

        // Per learner, cycled: learner 1 and 3 are 20 ms away, 0 and 2 at 1 ms.
        let sites = NetworkSpec { learner_latency: vec![0.001, 0.020], ..spec.clone() };
        let mut net = Network::new(&sites, 4, &[1000]).unwrap();
        let mut pull = |net: &mut Network, l| {
            net.arrival(0, Route { learner: LearnerId(l), ..route(Payload::Pull) }, &mut rng)
        };
        let (near, far) = (pull(&mut net, 2), pull(&mut net, 3));
        assert!(
            (1_000_000..1_200_000).contains(&near) && (20_000_000..20_200_000).contains(&far),
            "{near} {far}"
        );

        // Into a shard at 1 MB/s: two pushes on two links at once go in one after the other.
        let narrow = NetworkSpec { shard_bandwidth: 1e6, ..spec };
        let mut net = Network::new(&narrow, 2, &[1000]).unwrap();
        let first = net.arrival(0, route(Payload::Up), &mut rng);
        let second = net.arrival(0, Route { learner: LearnerId(1), ..route(Payload::Up) }, &mut rng);
        assert!((5_000_000..5_200_000).contains(&first), "its own link sets the first: {first}");
        assert_eq!(second - first, up_bytes * 1000, "the second waits its bytes' time at the shard");
    }
}
