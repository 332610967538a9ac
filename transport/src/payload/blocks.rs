//! What the block codecs share: a block's largest magnitude, and the check of a payload's
//! scales against its length.

use crate::TransportError;

/// The largest magnitude of `values`, NaN if one is NaN: for floats without their sign, the
/// order of the bits is the order of the numbers (NaNs above ±Inf above every finite value), so
/// this is an integer maximum, which vectorises.
pub(super) fn max_abs(values: impl Iterator<Item = f32>) -> f32 {
    f32::from_bits(values.map(|v| v.to_bits() & 0x7fff_ffff).max().unwrap_or(0))
}

/// A `codec` payload's scales must be one finite, non-negative number per block of `len`
/// values, its blocks of 1 to `max_block` values.
pub(super) fn check_scales(
    codec: &str,
    (block, max_block): (u32, u32),
    scales: &[f32],
    len: usize,
) -> Result<(), TransportError> {
    let bad = |why: String| TransportError::BadFrame(format!("a {codec} payload of {len} values {why}"));
    if block == 0 || block > max_block {
        return Err(bad(format!("has blocks of {block}; they must hold 1 to {max_block}")));
    }
    let blocks = len.div_ceil(block as usize);
    if scales.len() != blocks {
        return Err(bad(format!("in blocks of {block} has {} scales, not {blocks}", scales.len())));
    }
    if let Some((i, s)) = scales.iter().enumerate().find(|(_, s)| !(s.is_finite() && **s >= 0.0)) {
        return Err(bad(format!("has scale {s} in block {i}; scales are finite and non-negative")));
    }
    Ok(())
}
