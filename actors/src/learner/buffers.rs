//! A learner's buffers: its gradients (the newest, and those pushes still hold) and its side
//! of the payload codecs (error feedback, pushes kept for a retry, bytes moved).

use std::collections::VecDeque;
use std::sync::Arc;

use rudra_transport::quic::Traffic;
use rudra_transport::{Codecs, Floats, Payload};

use super::LearnerParts;

/// A learner's side of the payload codecs: the job's codecs, the error feedback of its
/// gradients, the compressed pushes kept for a retry, and the bytes it has moved.
pub(super) struct WireState {
    pub(super) codecs: Codecs,
    /// Exchanges add up like gradients (DOWNPOUR, MDOWNPOUR): the gradients codec and its
    /// feedback apply to them.
    pub(super) exchanges_gradients: bool,
    /// What compression below 16 bits left out of the gradients sent so far (empty unless the
    /// gradients codec needs it).
    feedback: Vec<f32>,
    /// Per shard, the pushes not answered yet, with their steps and examples: a retry sends
    /// each again as it was (the feedback already counts it as sent). An `f32` push is a view
    /// of its gradient buffer, which is not reused while the push is kept.
    pub(super) sent: Vec<VecDeque<(u64, Payload, u32)>>,
    /// Where this learner's connections count their bytes (none in one process).
    traffic: Option<Arc<Traffic>>,
    /// Traffic already reported.
    traffic_reported: u64,
}

impl WireState {
    pub(super) fn new(parts: &LearnerParts, shards: usize) -> Self {
        let codecs = parts.codecs;
        let feedback = if codecs.gradients.codec.needs_feedback() {
            vec![0.0; parts.model.param_count()]
        } else {
            Vec::new()
        };
        let traffic = parts.traffic.clone();
        let traffic_reported = traffic.as_ref().map_or(0, |t| t.sent() + t.received());
        let exchanges_gradients = parts.exchanges_gradients;
        let sent = vec![VecDeque::new(); shards];
        Self { codecs, exchanges_gradients, feedback, sent, traffic, traffic_reported }
    }

    /// `values` (the range `range` of a gradient-like vector) encoded with the gradients codec,
    /// their error feedback applied and updated.
    pub(super) fn gradient(&mut self, values: &Floats, range: std::ops::Range<usize>) -> Payload {
        let feedback = self.feedback.get_mut(range);
        self.codecs.gradients.encode(values, feedback)
    }

    /// Frame bytes the learner's connections moved since the last call.
    pub(super) fn traffic_since(&mut self) -> u64 {
        let Some(t) = &self.traffic else { return 0 };
        let now = t.sent() + t.received();
        std::mem::replace(&mut self.traffic_reported, now).abs_diff(now)
    }
}

/// Gradient buffers: the newest gradient, and earlier ones that pushes still hold, reused once
/// nothing holds them.
pub(super) struct Gradients {
    pub(super) newest: Arc<Vec<f32>>,
    /// The examples the newest gradient is the mean over.
    pub(super) examples: u32,
    spare: Vec<Arc<Vec<f32>>>,
}

impl Gradients {
    /// Buffers kept for reuse, beyond which a released one is dropped.
    const SPARE: usize = 4;

    pub(super) fn new(len: usize) -> Self {
        Self { newest: Arc::new(vec![0.0; len]), examples: 0, spare: Vec::new() }
    }

    /// A buffer for the next gradient, which becomes the newest: the newest itself when
    /// nothing else holds it (always, without prefetch), else one no push holds any more, else
    /// a new one.
    pub(super) fn next(&mut self) -> &mut Vec<f32> {
        if Arc::get_mut(&mut self.newest).is_none() {
            let free = self.spare.iter_mut().position(|b| Arc::get_mut(b).is_some());
            let fresh = match free {
                Some(i) => self.spare.swap_remove(i),
                None => Arc::new(vec![0.0; self.newest.len()]),
            };
            self.spare.push(std::mem::replace(&mut self.newest, fresh));
            self.spare.truncate(Self::SPARE);
        }
        // Unshared by now: this never copies.
        Arc::make_mut(&mut self.newest)
    }
}
