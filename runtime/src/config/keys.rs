//! The checks of `[protocol]`, `[training]`'s optimizer and `[transport]` that need no other
//! section: every key is checked whatever the protocol reads.

use rudra_actors::{BatchSizing, QuorumSpec};
use rudra_proto::{LateRule, OptimizerSpec};
use rudra_transport::payload::{MAX_BLOCK, topk};
use rudra_transport::{Codec, Codecs, Encoding};

use super::raw::{RawConfig, RawTraining, RawTransport};
use super::{invalid, one_of};
use crate::RuntimeError;

/// Every key of `[protocol]` (and γ of `[training]`) is checked whatever the protocol, so a
/// bad value never waits for the protocol that reads it.
pub(super) fn check_every_protocol_key(raw: &RawConfig) -> Result<(), RuntimeError> {
    let p = &raw.protocol;
    let positive = |key, v: Option<f32>| match v {
        Some(v) if !(v.is_finite() && v > 0.0) => Err(invalid(key, format!("is {v}; it must be positive"))),
        _ => Ok(()),
    };
    // β first: α defaults to β / λ.
    positive("protocol.beta", p.beta)?;
    positive("protocol.alpha", p.alpha)?;
    positive("training.learning_rate", raw.training.learning_rate)?;
    if p.tau == Some(0) {
        return Err(invalid("protocol.tau", "must be at least 1"));
    }
    if p.fragments == Some(0) {
        return Err(invalid("protocol.fragments", "must be at least 1"));
    }
    positive("protocol.outer_lr", p.outer_lr)?;
    let t = &raw.training;
    positive("training.eps", t.eps)?;
    if let Some(w) = t.weight_decay
        && !(w.is_finite() && w >= 0.0)
    {
        return Err(invalid("training.weight_decay", format!("is {w}; it must be 0 or more")));
    }
    let fractions = [
        ("protocol.momentum", p.momentum),
        ("protocol.outer_momentum", p.outer_momentum),
        ("training.momentum", t.momentum),
        ("training.beta1", t.beta1),
        ("training.beta2", t.beta2),
    ];
    for (key, momentum) in fractions {
        if let Some(m) = momentum
            && !(m.is_finite() && (0.0..1.0).contains(&m))
        {
            return Err(invalid(key, format!("is {m}; it must be in [0, 1)")));
        }
    }
    let gamma = raw.training.lr_decay_gamma;
    if !(gamma.is_finite() && gamma >= 0.0) {
        return Err(invalid("training.lr_decay_gamma", format!("is {gamma}; it must be 0 or more")));
    }
    Ok(())
}

/// The grace window's cap when `protocol.grace_max_ms` is not set.
const DEFAULT_GRACE_MS: u64 = 50;

/// `protocol.quorum` with `late` and `grace_max_ms` (checked always, read only with a quorum,
/// so that a study may hold them fixed along an axis of quorums that includes 0).
pub(super) fn quorum(raw: &RawConfig) -> Result<Option<QuorumSpec>, RuntimeError> {
    let p = &raw.protocol;
    let late = match p.late.as_deref().unwrap_or("fold") {
        "fold" => LateRule::Fold,
        "drop" => LateRule::Drop,
        other => return Err(invalid("protocol.late", format!("{other:?} is not one of fold, drop"))),
    };
    let grace_max_ms = p.grace_max_ms.unwrap_or(DEFAULT_GRACE_MS);
    Ok((p.quorum > 0).then_some(QuorumSpec { size: p.quorum, late, grace_max_ms }))
}

/// `training.batch_sizing`.
pub(super) fn batch_sizing(t: &RawTraining) -> Result<BatchSizing, RuntimeError> {
    match t.batch_sizing.as_deref().unwrap_or("fixed") {
        "fixed" => Ok(BatchSizing::Fixed),
        "adaptive" => Ok(BatchSizing::Adaptive),
        other => Err(invalid("training.batch_sizing", format!("{other:?} is not one of fixed, adaptive"))),
    }
}

/// `training.optimizer` with its settings.
pub(super) fn optimizer(t: &RawTraining) -> Result<OptimizerSpec, RuntimeError> {
    match t.optimizer.as_str() {
        "sgd" => Ok(OptimizerSpec::Sgd),
        "momentum" => Ok(OptimizerSpec::Momentum { momentum: t.momentum.unwrap_or(0.9) }),
        "adamw" => Ok(OptimizerSpec::AdamW {
            beta1: t.beta1.unwrap_or(0.9),
            beta2: t.beta2.unwrap_or(0.999),
            eps: t.eps.unwrap_or(1e-8),
            weight_decay: t.weight_decay.unwrap_or(0.01),
        }),
        other => Err(invalid("training.optimizer", format!("{other:?} is not one of sgd, momentum, adamw"))),
    }
}

/// `[transport]`: the codecs of gradients and weights.
pub(super) fn codecs(t: &RawTransport) -> Result<Codecs, RuntimeError> {
    let block = t.codec_block;
    if !(1..=MAX_BLOCK).contains(&block) {
        return Err(invalid(
            "transport.codec_block",
            format!("is {block}; it must be between 1 and {MAX_BLOCK}"),
        ));
    }
    let kappa = t.topk_fraction;
    if !(kappa.is_finite() && kappa > 0.0 && kappa <= 1.0) {
        return Err(invalid("transport.topk_fraction", format!("is {kappa}; it must be in (0, 1]")));
    }
    // ⌈κB⌉ of each block, at least one.
    let keep = ((kappa * f64::from(block)).ceil() as u32).clamp(1, block);
    let encoding = |key, name: &str| {
        let codec = one_of(key, name, &Codec::ALL, Codec::as_str)?;
        Ok::<_, RuntimeError>(Encoding { codec, block, keep })
    };
    let codecs = Codecs {
        gradients: encoding("transport.gradient_codec", &t.gradient_codec)?,
        weights: encoding("transport.weight_codec", &t.weight_codec)?,
    };
    if codecs.weights.codec == Codec::TopK {
        return Err(invalid(
            "transport.weight_codec",
            "is topk, which sends a few values of each block: weights and centers travel whole \
             (topk is for transport.gradient_codec)",
        ));
    }
    if codecs.gradients.codec == Codec::TopK && block > topk::MAX_BLOCK {
        return Err(invalid(
            "transport.codec_block",
            format!("is {block}; topk indexes a block with 16 bits, so at most {}", topk::MAX_BLOCK),
        ));
    }
    Ok(codecs)
}
