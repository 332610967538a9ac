//! Progress of a long simulation or study: a bar on a terminal, a log line every tenth
//! otherwise.

use std::time::Instant;

use indicatif::ProgressBar;

use crate::local::{ProgressMode, bar_style};

/// Bar positions per run.
const STEPS: u64 = 1000;

/// Shows how far a simulation is.
pub struct Progress {
    mode: ProgressMode,
    bar: Option<ProgressBar>,
    next_log: f64,
    started: Instant,
}

impl Progress {
    /// Progress shown as `mode` says.
    #[must_use]
    pub fn new(mode: ProgressMode) -> Self {
        Self { mode, bar: None, next_log: 0.1, started: Instant::now() }
    }

    /// `done` (0 to 1) of the run is done; `message` says where it stands.
    pub fn update(&mut self, done: f64, message: impl FnOnce() -> String) {
        match self.mode {
            ProgressMode::Quiet => {}
            ProgressMode::Bar => {
                let bar = self.bar.get_or_insert_with(|| {
                    let b = ProgressBar::new(STEPS);
                    b.set_style(bar_style());
                    b
                });
                bar.set_position((done.clamp(0.0, 1.0) * STEPS as f64) as u64);
                bar.set_message(message());
            }
            ProgressMode::Log if done >= self.next_log => {
                self.next_log = (done * 10.0).floor() / 10.0 + 0.1;
                let wall = self.started.elapsed().as_secs_f64();
                tracing::info!("{:>3.0}% {} ({wall:.1} s)", done * 100.0, message());
            }
            ProgressMode::Log => {}
        }
    }

    /// Print `line` on standard output, above the bar if one is drawn.
    pub fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.suspend(|| println!("{line}")),
            None => println!("{line}"),
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}
