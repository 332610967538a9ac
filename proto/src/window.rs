//! Which of a learner's pushes a shard has taken: the newest, and a bitmap of the
//! [`PushWindow::SPAN`] steps before it, as a replay window. A learner with prefetch k has at
//! most k + 1 pushes unanswered, so its pushes may arrive out of order (each payload travels
//! on a stream of its own) or be sent again, but never more than k + 1 steps apart; a window
//! far wider than any allowed k tells every late copy from a push not yet taken.

/// The pushes taken from one learner (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PushWindow {
    /// The highest step taken (0 before any).
    pub newest: u64,
    /// Bit `d − 1` is set when step `newest − d` was taken, for `1 ≤ d ≤ SPAN`.
    pub below: u64,
}

impl PushWindow {
    /// Steps below the newest that the window tells apart; anything older is a late copy.
    pub const SPAN: u64 = 64;

    /// Whether the push of step `seq` was taken already, or is too old to be anything but a
    /// late copy.
    #[must_use]
    pub fn contains(&self, seq: u64) -> bool {
        match self.newest.checked_sub(seq) {
            None => false,
            Some(0) => self.newest > 0,
            Some(d) if d > Self::SPAN => true,
            Some(d) => self.below >> (d - 1) & 1 == 1,
        }
    }

    /// Note that the push of step `seq` was taken.
    pub fn insert(&mut self, seq: u64) {
        match self.newest.checked_sub(seq) {
            None => {
                let shift = seq - self.newest;
                self.below = if self.newest == 0 || shift > Self::SPAN {
                    0
                } else {
                    self.below.checked_shl(shift as u32).unwrap_or(0) | 1 << (shift - 1)
                };
                self.newest = seq;
            }
            Some(d) if (1..=Self::SPAN).contains(&d) => self.below |= 1 << (d - 1),
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_tells_late_copies_from_pushes_not_yet_taken() {
        let mut w = PushWindow::default();
        assert!(!w.contains(1), "nothing taken yet");
        w.insert(2);
        assert!(w.contains(2) && !w.contains(1) && !w.contains(3), "1 overtaken by 2, not taken");
        w.insert(1);
        assert!(w.contains(1) && w.contains(2));
        w.insert(5);
        assert_eq!(w, PushWindow { newest: 5, below: 0b1100 });
        assert!(!w.contains(4) && !w.contains(3) && w.contains(2));
        w.insert(70);
        assert!(w.contains(5) && !w.contains(6) && !w.contains(69), "5 is 65 below: too old to tell");
        w.insert(70 + 64);
        assert_eq!(w.below, 1 << 63, "70 is the last step the window still sees");
        w.insert(1 << 40);
        assert_eq!(w, PushWindow { newest: 1 << 40, below: 0 }, "a jump (a new incarnation) clears it");
        assert!(w.contains(70) && !w.contains((1 << 40) + 1));
    }
}
