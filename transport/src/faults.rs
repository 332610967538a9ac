//! Link fault rules and the seeded dice that decide each message's fate.
//!
//! [`LinkFaults`] describes one direction of a link: how often a message is lost, duplicated
//! or held back behind later ones, and how long it is delayed. [`FaultDice`] turns the rules
//! into a [`Fate`] per message from a seeded ChaCha stream, so a run with the same seed and
//! the same sequence of messages makes the same decisions. Both are pure: no clock, no
//! sockets. The UDP [`relay`](crate::relay) and in-process injectors drive them.

use std::time::Duration;

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::TransportError;

/// The longest delay or jitter a rule may ask for; anything longer is a mistake, not a link.
pub const MAX_DELAY: Duration = Duration::from_secs(3600);

/// The least extra hold of a reordered message: it lands behind what follows within this time.
pub const REORDER_HOLD: Duration = Duration::from_millis(1);

/// Faults on one direction of a link. The default is a clean link.
///
/// Serialized with the durations as whole milliseconds in `delay_ms` and `jitter_ms`
/// (sub-millisecond parts are dropped when writing); missing fields take their defaults:
///
/// ```
/// # use rudra_transport::LinkFaults;
/// let rules: LinkFaults = serde_json::from_str(r#"{ "drop": 0.05, "delay_ms": 20 }"#).unwrap();
/// assert_eq!(rules.delay, std::time::Duration::from_millis(20));
/// rules.validate().unwrap();
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LinkFaults {
    /// Probability that a message is lost.
    pub drop: f64,
    /// Probability that a delivered message arrives twice.
    pub duplicate: f64,
    /// Probability that a delivered message is held back behind the messages that follow it.
    pub reorder: f64,
    /// Base delay of every delivered message.
    #[serde(rename = "delay_ms", with = "millis")]
    pub delay: Duration,
    /// Each delay varies uniformly by up to this much either way (never below zero), so
    /// messages sent closer together than the jitter may swap places.
    #[serde(rename = "jitter_ms", with = "millis")]
    pub jitter: Duration,
}

impl LinkFaults {
    /// Check that the probabilities are numbers from 0 to 1 and the durations at most
    /// [`MAX_DELAY`]; the error names the offending field.
    pub fn validate(&self) -> Result<(), TransportError> {
        for (field, p) in [("drop", self.drop), ("duplicate", self.duplicate), ("reorder", self.reorder)] {
            if !(p.is_finite() && (0.0..=1.0).contains(&p)) {
                return Err(TransportError::FaultRule {
                    field,
                    problem: format!("{p} is not a probability; use a number from 0 to 1"),
                });
            }
        }
        for (field, d) in [("delay", self.delay), ("jitter", self.jitter)] {
            if d > MAX_DELAY {
                return Err(TransportError::FaultRule {
                    field,
                    problem: format!("{d:?} is longer than {MAX_DELAY:?}; use a shorter duration"),
                });
            }
        }
        Ok(())
    }

    /// Whether these rules deliver every message once, at once and in order.
    #[must_use]
    pub fn is_clean(&self) -> bool {
        self.drop == 0.0
            && self.duplicate == 0.0
            && self.reorder == 0.0
            && self.delay.is_zero()
            && self.jitter.is_zero()
    }
}

/// What happens to one message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// The message is lost.
    Drop,
    /// The message arrives `copies` times (1 or 2), each after `delay`.
    Deliver {
        /// How long the message is held before it is delivered.
        delay: Duration,
        /// How many times it is delivered.
        copies: u8,
    },
}

/// Seeded dice that roll a [`Fate`] per message.
///
/// Every roll draws the same four values (drop, jitter, reorder, duplicate) whatever the
/// outcome, so changing one probability never shifts the randomness of later messages.
#[derive(Clone, Debug)]
pub struct FaultDice {
    rng: ChaCha8Rng,
}

impl FaultDice {
    /// Dice seeded with `seed`.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self::with_stream(seed, 0)
    }

    /// Dice seeded with `seed` on an independent `stream`: one per link or direction keeps
    /// each reproducible however the messages of different links interleave.
    #[must_use]
    pub fn with_stream(seed: u64, stream: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(stream);
        Self { rng }
    }

    /// The fate of the next message under `rules`. Rules are meant to be validated, but
    /// nothing panics without: a probability above 1 always happens, below 0 or NaN never.
    pub fn roll(&mut self, rules: &LinkFaults) -> Fate {
        let dropped = self.chance(rules.drop);
        let jitter = nanos(rules.jitter);
        let offset = self.below(jitter.saturating_mul(2));
        let reordered = self.chance(rules.reorder);
        let duplicated = self.chance(rules.duplicate);
        if dropped {
            return Fate::Drop;
        }
        let mut delay = (i128::from(nanos(rules.delay)) + i128::from(offset) - i128::from(jitter)).max(0);
        if reordered {
            delay += i128::from(nanos(rules.jitter.saturating_mul(2).max(REORDER_HOLD)));
        }
        let delay = Duration::from_nanos(u64::try_from(delay).unwrap_or(u64::MAX));
        Fate::Deliver { delay, copies: if duplicated { 2 } else { 1 } }
    }

    /// True with probability `p` (one draw).
    fn chance(&mut self, p: f64) -> bool {
        self.rng.random::<f64>() < p
    }

    /// Uniform in `0..=max` (one draw; the bias is below 2⁻⁶⁴ × `max`).
    fn below(&mut self, max: u64) -> u64 {
        let wide = u128::from(self.rng.next_u64()) * (u128::from(max) + 1);
        u64::try_from(wide >> 64).unwrap_or(max)
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// When fault rules apply, measured from the start of a run; outside it the link is clean.
/// The default is always.
///
/// Serialized as `from_ms` and `until_ms` (whole milliseconds; no `until_ms` means forever).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultWindow {
    /// Rules apply from this time on.
    #[serde(rename = "from_ms", with = "millis")]
    pub from: Duration,
    /// Rules stop applying at this time; `None` is never.
    #[serde(rename = "until_ms", with = "millis_opt", skip_serializing_if = "Option::is_none")]
    pub until: Option<Duration>,
}

impl FaultWindow {
    /// Check that the window ends after it starts.
    pub fn validate(&self) -> Result<(), TransportError> {
        match self.until {
            Some(until) if until <= self.from => Err(TransportError::FaultRule {
                field: "until",
                problem: format!("the window ends at {until:?}, not after it starts at {:?}", self.from),
            }),
            _ => Ok(()),
        }
    }

    /// Whether rules apply `elapsed` after the start.
    #[must_use]
    pub fn contains(&self, elapsed: Duration) -> bool {
        elapsed >= self.from && self.until.is_none_or(|until| elapsed < until)
    }
}

/// Durations as whole milliseconds.
mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

/// Optional durations as whole milliseconds.
mod millis_opt {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => super::millis::serialize(d, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Option::<u64>::deserialize(d).map(|ms| ms.map(Duration::from_millis))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROLLS: usize = 20_000;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// How often `pick` holds over `ROLLS` rolls, checked within 5 standard deviations of `p`.
    fn assert_frequency(rules: &LinkFaults, p: f64, pick: impl Fn(Fate) -> bool) {
        let mut dice = FaultDice::new(7);
        let hits = (0..ROLLS).filter(|_| pick(dice.roll(rules))).count() as f64;
        let n = ROLLS as f64;
        let sd = (n * p * (1.0 - p)).sqrt();
        assert!((hits - n * p).abs() <= 5.0 * sd + 1.0, "{hits} hits in {ROLLS}, expected about {}", n * p);
    }

    #[test]
    fn drop_and_duplicate_happen_as_often_as_asked() {
        for p in [0.0, 0.05, 0.3, 0.5, 1.0] {
            let drops = LinkFaults { drop: p, ..LinkFaults::default() };
            assert_frequency(&drops, p, |f| f == Fate::Drop);
            let dups = LinkFaults { duplicate: p, ..LinkFaults::default() };
            assert_frequency(&dups, p, |f| matches!(f, Fate::Deliver { copies: 2, .. }));
        }
        // Duplicates are counted among the delivered messages only.
        let both = LinkFaults { drop: 0.5, duplicate: 0.5, ..LinkFaults::default() };
        assert_frequency(&both, 0.25, |f| matches!(f, Fate::Deliver { copies: 2, .. }));
    }

    #[test]
    fn delays_stay_within_the_jitter_and_reordered_ones_are_held_longer() {
        let rules = LinkFaults { delay: ms(50), jitter: ms(10), ..LinkFaults::default() };
        let mut dice = FaultDice::new(1);
        let delays: Vec<Duration> = (0..ROLLS)
            .map(|_| match dice.roll(&rules) {
                Fate::Deliver { delay, copies: 1 } => delay,
                other => panic!("a clean delivery, not {other:?}"),
            })
            .collect();
        assert!(delays.iter().all(|d| (ms(40)..=ms(60)).contains(d)));
        assert!(
            delays.iter().any(|d| *d < ms(42)) && delays.iter().any(|d| *d > ms(58)),
            "the range is used"
        );
        let mean = delays.iter().sum::<Duration>() / ROLLS as u32;
        assert!((ms(49)..=ms(51)).contains(&mean), "{mean:?}");

        // Jitter larger than the delay clamps at zero.
        let clamped = LinkFaults { delay: ms(1), jitter: ms(5), ..LinkFaults::default() };
        let zeros = (0..1000).filter(|_| dice.roll(&clamped) == Fate::Deliver { delay: ms(0), copies: 1 });
        assert!(zeros.count() > 100);

        // A reordered message is held beyond any jitter, by at least `REORDER_HOLD`.
        let reorder = LinkFaults { reorder: 1.0, ..rules };
        for _ in 0..1000 {
            assert!(matches!(dice.roll(&reorder), Fate::Deliver { delay, .. } if delay >= ms(60)));
        }
        let hold = LinkFaults { reorder: 1.0, ..LinkFaults::default() };
        assert_eq!(dice.roll(&hold), Fate::Deliver { delay: REORDER_HOLD, copies: 1 });
    }

    #[test]
    fn the_same_seed_makes_the_same_fates() {
        let rules = [
            LinkFaults { drop: 0.2, duplicate: 0.1, reorder: 0.1, delay: ms(5), jitter: ms(3) },
            LinkFaults::default(),
            LinkFaults { drop: 0.9, ..LinkFaults::default() },
        ];
        let run = |seed: u64, stream: u64| -> Vec<Fate> {
            let mut dice = FaultDice::with_stream(seed, stream);
            (0..3000).map(|i| dice.roll(&rules[i % rules.len()])).collect()
        };
        assert_eq!(run(42, 0), run(42, 0));
        assert_eq!(run(42, 0), {
            let mut dice = FaultDice::new(42);
            (0..3000).map(|i| dice.roll(&rules[i % rules.len()])).collect::<Vec<_>>()
        });
        assert_ne!(run(42, 0), run(43, 0));
        assert_ne!(run(42, 0), run(42, 1), "streams are independent");
    }

    #[test]
    fn a_higher_drop_rate_only_adds_drops() {
        let (mut low, mut high) = (FaultDice::new(3), FaultDice::new(3));
        let l = LinkFaults { drop: 0.1, duplicate: 0.2, reorder: 0.1, delay: ms(5), jitter: ms(2) };
        let h = LinkFaults { drop: 0.3, ..l.clone() };
        for _ in 0..ROLLS {
            let (a, b) = (low.roll(&l), high.roll(&h));
            assert!(a != Fate::Drop || b == Fate::Drop);
        }
    }

    #[test]
    fn validation_names_the_bad_field() {
        assert!(LinkFaults::default().is_clean());
        LinkFaults::default().validate().unwrap();
        LinkFaults { drop: 1.0, duplicate: 0.0, reorder: 0.5, delay: ms(10), jitter: MAX_DELAY }
            .validate()
            .unwrap();
        let cases = [
            ("drop", LinkFaults { drop: -0.1, ..LinkFaults::default() }),
            ("drop", LinkFaults { drop: f64::NAN, ..LinkFaults::default() }),
            ("duplicate", LinkFaults { duplicate: 1.5, ..LinkFaults::default() }),
            ("reorder", LinkFaults { reorder: f64::INFINITY, ..LinkFaults::default() }),
            ("jitter", LinkFaults { jitter: MAX_DELAY + ms(1), ..LinkFaults::default() }),
        ];
        for (field, rules) in cases {
            assert!(!rules.is_clean());
            let err = rules.validate().unwrap_err();
            assert!(matches!(err, TransportError::FaultRule { field: f, .. } if f == field), "{err}");
            assert!(err.to_string().contains(field), "{err}");
        }
        // Unvalidated rules still roll without panicking.
        let wild = LinkFaults {
            drop: f64::NAN,
            duplicate: 7.0,
            reorder: -1.0,
            delay: Duration::MAX,
            jitter: Duration::MAX,
        };
        FaultDice::new(0).roll(&wild);
    }

    #[test]
    fn windows_open_and_close() {
        assert!(
            FaultWindow::default().contains(Duration::ZERO) && FaultWindow::default().contains(MAX_DELAY)
        );
        let w = FaultWindow { from: ms(100), until: Some(ms(300)) };
        w.validate().unwrap();
        assert_eq!([ms(99), ms(100), ms(299), ms(300)].map(|t| w.contains(t)), [false, true, true, false]);
        let empty = FaultWindow { from: ms(300), until: Some(ms(300)) };
        assert!(matches!(empty.validate(), Err(TransportError::FaultRule { field: "until", .. })));
        assert_eq!(serde_json::to_string(&w).unwrap(), r#"{"from_ms":100,"until_ms":300}"#);
        assert_eq!(serde_json::from_str::<FaultWindow>(r#"{"from_ms":100,"until_ms":300}"#).unwrap(), w);
        assert_eq!(serde_json::from_str::<FaultWindow>("{}").unwrap(), FaultWindow::default());
    }

    #[test]
    fn serde_uses_milliseconds_and_defaults() {
        let rules = LinkFaults { drop: 0.25, duplicate: 0.0, reorder: 0.5, delay: ms(20), jitter: ms(3) };
        let json = serde_json::to_string(&rules).unwrap();
        assert!(json.contains(r#""delay_ms":20"#) && json.contains(r#""jitter_ms":3"#), "{json}");
        assert_eq!(serde_json::from_str::<LinkFaults>(&json).unwrap(), rules);
        assert_eq!(serde_json::from_str::<LinkFaults>("{}").unwrap(), LinkFaults::default());
        assert!(serde_json::from_str::<LinkFaults>(r#"{"delay": 5}"#).is_err(), "unknown fields are refused");
        assert!(serde_json::from_str::<LinkFaults>(r#"{"delay_ms": -5}"#).is_err());
    }
}
