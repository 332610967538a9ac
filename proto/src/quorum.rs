//! The grace window of quorum rounds (`docs/src/algorithms.md` §5.2): once a round holds its
//! quorum of q contributions it stays open for w more, so stragglers that are about to arrive
//! still make it in, with w = min(w_max, p90 of the recent gaps between a round's q-th and
//! last contribution). A pure clock-fed rule: the shard actor feeds it times and arrivals.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use crate::Clock;

/// Gaps remembered for the percentile.
const RECENT: usize = 32;

/// A round whose quorum was reached and whose last contribution has not arrived.
#[derive(Clone, Copy, Debug)]
struct Open {
    /// When the quorum was reached.
    at: Duration,
    /// Contributions still to come.
    missing: usize,
}

/// Chooses each round's grace window from the gaps of recent rounds.
#[derive(Clone, Debug)]
pub struct GraceWindow {
    max: Duration,
    gaps: VecDeque<Duration>,
    open: BTreeMap<Clock, Open>,
}

impl GraceWindow {
    /// A window of at most `max`; before any gap is known it is `max`.
    #[must_use]
    pub fn new(max: Duration) -> Self {
        Self { max, gaps: VecDeque::new(), open: BTreeMap::new() }
    }

    /// The round on `clock` reached its quorum at `now` with `missing` contributions still to
    /// come: how long it stays open.
    pub fn quorum(&mut self, clock: Clock, missing: usize, now: Duration) -> Duration {
        self.expire(now);
        if missing > 0 {
            self.open.insert(clock, Open { at: now, missing });
        }
        self.window()
    }

    /// A contribution computed on `clock` arrived at `now` (applied, folded or dropped).
    pub fn arrived(&mut self, clock: Clock, now: Duration) {
        if let Some(open) = self.open.get_mut(&clock) {
            open.missing -= 1;
            if open.missing == 0 {
                let gap = now.saturating_sub(open.at);
                self.open.remove(&clock);
                self.record(gap);
            }
        }
        self.expire(now);
    }

    /// w = min(w_max, p90 of the recent gaps); w_max while none is known.
    #[must_use]
    pub fn window(&self) -> Duration {
        if self.gaps.is_empty() {
            return self.max;
        }
        let mut sorted: Vec<Duration> = self.gaps.iter().copied().collect();
        sorted.sort_unstable();
        let p90 = sorted[(sorted.len() * 9).div_ceil(10) - 1];
        p90.min(self.max)
    }

    /// A round still missing contributions after w_max has a gap of at least w_max, which is
    /// all the window needs to know of it.
    fn expire(&mut self, now: Duration) {
        let max = self.max;
        let expired: Vec<Clock> =
            self.open.iter().filter(|(_, o)| now.saturating_sub(o.at) >= max).map(|(&c, _)| c).collect();
        for clock in expired {
            self.open.remove(&clock);
            self.record(max);
        }
    }

    fn record(&mut self, gap: Duration) {
        if self.gaps.len() == RECENT {
            self.gaps.pop_front();
        }
        self.gaps.push_back(gap);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_window_is_the_p90_of_recent_gaps_capped_by_its_maximum() {
        let mut w = GraceWindow::new(ms(50));
        assert_eq!(w.quorum(Clock(0), 2, ms(0)), ms(50), "no gap known yet: the maximum");
        w.arrived(Clock(0), ms(3));
        w.arrived(Clock(0), ms(7));
        assert_eq!(w.window(), ms(7), "one round: its gap from the q-th to the last");
        // Nine more rounds with gaps of 1..=9 ms: ten gaps, the 9th smallest is the p90.
        for r in 1..10u64 {
            w.quorum(Clock(r), 1, ms(100 * r));
            w.arrived(Clock(r), ms(100 * r + r));
        }
        assert_eq!(w.window(), ms(8), "gaps 1..9 and 7: p90 of ten is the ninth");
        // A round whose stragglers never come counts w_max once w_max has passed.
        w.quorum(Clock(10), 3, ms(2000));
        w.arrived(Clock(11), ms(2100));
        assert_eq!(w.window(), ms(9));
        for r in 11..40u64 {
            w.quorum(Clock(r), 1, ms(3000 + 100 * r));
            w.arrived(Clock(r), ms(3000 + 100 * r + 60));
        }
        assert_eq!(w.window(), ms(50), "late rounds cap at the maximum");
        assert!(w.open.is_empty() && w.gaps.len() == RECENT, "bounded memory");
    }

    #[test]
    fn a_round_with_nothing_missing_opens_nothing() {
        let mut w = GraceWindow::new(ms(5));
        assert_eq!(w.quorum(Clock(3), 0, ms(0)), ms(5));
        assert!(w.open.is_empty());
        w.arrived(Clock(3), ms(1));
        assert!(w.gaps.is_empty(), "an arrival for no open round records nothing");
    }
}
