//! Virtual time, the event queue and the trace hash.
//!
//! Events are ordered by their virtual time and, at equal times, by the order in which they
//! were scheduled, so a run is a pure function of its configuration and seed.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Virtual time in nanoseconds.
pub type Nanos = u64;

/// Seconds to virtual nanoseconds, rounded.
#[must_use]
pub fn nanos(seconds: f64) -> Nanos {
    (seconds * 1e9).round() as Nanos
}

/// Virtual nanoseconds to seconds.
#[must_use]
pub fn seconds(t: Nanos) -> f64 {
    t as f64 / 1e9
}

struct Entry<E> {
    at: Nanos,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl<E> Eq for Entry<E> {}

impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<E> Ord for Entry<E> {
    /// Reversed, so that the max-heap pops the earliest (time, sequence number) first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// Events waiting for their virtual time.
pub struct EventQueue<E> {
    heap: BinaryHeap<Entry<E>>,
    seq: u64,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        Self { heap: BinaryHeap::new(), seq: 0 }
    }
}

impl<E> EventQueue<E> {
    /// Schedule `event` at `at`.
    pub fn push(&mut self, at: Nanos, event: E) {
        self.heap.push(Entry { at, seq: self.seq, event });
        self.seq += 1;
    }

    /// The earliest event, first scheduled first among equal times.
    pub fn pop(&mut self) -> Option<(Nanos, E)> {
        self.heap.pop().map(|e| (e.at, e.event))
    }
}

/// FNV-1a, 64 bits, over the little-endian bytes of what is written: a hash that is the same
/// on every platform and in every build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceHash(u64);

impl Default for TraceHash {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl TraceHash {
    /// Add bytes.
    pub fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    /// Add a number.
    pub fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }

    /// The hash so far.
    #[must_use]
    pub fn value(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_first_and_ties_in_scheduling_order() {
        let mut q = EventQueue::default();
        for (at, name) in [(5, "a"), (1, "b"), (5, "c"), (0, "d"), (1, "e"), (5, "f")] {
            q.push(at, name);
        }
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, vec![(0, "d"), (1, "b"), (1, "e"), (5, "a"), (5, "c"), (5, "f")]);
    }

    #[test]
    fn fnv1a_matches_the_reference_values() {
        let hash = |s: &str| {
            let mut h = TraceHash::default();
            h.bytes(s.as_bytes());
            h.value()
        };
        assert_eq!(hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(hash("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(hash("foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn seconds_round_trip() {
        assert_eq!(nanos(0.1), 100_000_000);
        assert_eq!(seconds(nanos(2.5)), 2.5);
    }
}
