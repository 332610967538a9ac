//! A link of fixed bandwidth, as a pure rule on a clock: each datagram leaves once those before
//! it have, and takes its length over the rate to do so; the link buffers at most a set
//! backlog (drop-tail beyond it), as a router port does.

use std::time::Duration;

/// The least backlog a paced link buffers, however short its round trip.
pub const MIN_BUFFER: Duration = Duration::from_millis(5);

/// One direction of a link of `rate` bytes per second.
#[derive(Clone, Debug)]
pub(super) struct Pacer {
    /// Nanoseconds per byte.
    per_byte: f64,
    /// The most backlog a datagram may queue behind.
    buffer: Duration,
    /// When the link is free again, on the caller's clock.
    free: Duration,
}

impl Pacer {
    /// A link of `rate` bytes per second buffering `buffer` of backlog (at least
    /// [`MIN_BUFFER`]); none for a rate of 0 (unlimited).
    pub(super) fn new(rate: f64, buffer: Duration) -> Option<Self> {
        (rate > 0.0).then(|| Self {
            per_byte: 1e9 / rate,
            buffer: buffer.max(MIN_BUFFER),
            free: Duration::ZERO,
        })
    }

    /// A datagram of `len` bytes offered at `now`: how long until its last byte has left, or
    /// `None` when the backlog ahead of it is over the buffer (dropped; the link is unchanged).
    pub(super) fn admit(&mut self, now: Duration, len: usize) -> Option<Duration> {
        let start = self.free.max(now);
        if start - now > self.buffer {
            return None;
        }
        // Saturating: a rate of a byte a century is the caller's to refuse, not a panic.
        self.free = start.saturating_add(Duration::from_nanos((len as f64 * self.per_byte).round() as u64));
        Some(self.free - now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn datagrams_leave_one_after_another_at_the_rate_and_a_full_buffer_drops() {
        assert!(Pacer::new(0.0, MS).is_none(), "0: unlimited");
        // 1 MB/s: a 1,000-byte datagram takes 1 ms; 5 ms of buffer.
        let mut p = Pacer::new(1e6, MS).unwrap();
        let waits: Vec<_> = (0..7).map(|_| p.admit(Duration::ZERO, 1000)).collect();
        let ms = |n: u32| Some(MS * n);
        assert_eq!(waits, [ms(1), ms(2), ms(3), ms(4), ms(5), ms(6), None], "5 ms of backlog, then drops");
        // A datagram offered once the link has drained leaves at once.
        assert_eq!(p.admit(MS * 100, 500), Some(MS / 2));
        // Half-way through it, the next queues behind what is left.
        assert_eq!(p.admit(MS * 100 + MS / 4, 1000), Some(MS / 4 + MS));
    }
}
