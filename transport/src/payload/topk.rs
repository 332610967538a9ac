//! The `topk` codec (sparse exchanges for thin links): per block of B values the `keep` largest
//! in magnitude (all of a last, shorter block when it holds fewer), each sent as its index in
//! the block and a 2-bit code on the block's grid {−s, −s/3, +s/3, +s}, s the block's largest
//! magnitude. With error feedback, what a message leaves out (the values not sent, and the
//! rounding of those sent) is carried into the next, so nothing is lost, only delayed.

use super::blocks::{check_scales, max_abs};
use crate::TransportError;

/// The largest block: an index within a block is 16 bits.
pub const MAX_BLOCK: u32 = 1 << 16;

/// The value of each code, as a multiple of the block's scale.
const LEVELS: [f32; 4] = [-1.0, -1.0 / 3.0, 1.0 / 3.0, 1.0];

/// What one message carries of its values.
pub(super) struct Sparse {
    /// Values per block, as encoded (the requested block, at most [`MAX_BLOCK`]).
    pub block: u32,
    /// Values kept per block, as encoded (1 ..= block).
    pub keep: u32,
    /// Each block's largest magnitude.
    pub scales: Vec<f32>,
    /// The kept values' indices within their block, rising within each block.
    pub indices: Vec<u16>,
    /// Their codes, four to a byte, the first in the lowest bits.
    pub codes: Vec<u8>,
}

/// Values kept of a block of `len` values.
fn kept(len: usize, keep: u32) -> usize {
    len.min(keep as usize)
}

/// Values kept of `len` values in blocks of `block`, `keep` of each.
#[must_use]
pub fn entries(len: usize, block: u32, keep: u32) -> usize {
    let b = block.max(1) as usize;
    (len / b) * kept(b, keep) + kept(len % b, keep)
}

/// The code of `y` (times `inv`, one over the block's scale): the nearest level.
fn code(y: f32, inv: f32) -> u8 {
    let r = y * inv;
    u8::from(r >= -2.0 / 3.0) + u8::from(r >= 0.0) + u8::from(r >= 2.0 / 3.0)
}

/// The `topk` message of `values` in blocks of `block`, `keep` of each. With `feedback` (as
/// long as `values`), `values + feedback` is sent and `feedback` becomes what that left out.
///
/// # Panics
/// If `feedback` is not as long as `values`.
pub(super) fn encode(values: &[f32], block: u32, keep: u32, mut feedback: Option<&mut [f32]>) -> Sparse {
    let block = block.clamp(1, MAX_BLOCK);
    let keep = keep.clamp(1, block);
    let b = block as usize;
    let n = entries(values.len(), block, keep);
    let mut out = Sparse {
        block,
        keep,
        scales: Vec::with_capacity(values.len().div_ceil(b)),
        indices: Vec::with_capacity(n),
        codes: vec![0; n.div_ceil(4)],
    };
    if let Some(e) = &feedback {
        assert_eq!(e.len(), values.len(), "feedback must be as long as the values");
    }
    let (mut y, mut order) = (vec![0.0_f32; b], Vec::with_capacity(b));
    for (k, chunk) in values.chunks(b).enumerate() {
        let y = &mut y[..chunk.len()];
        let e = feedback.as_deref_mut().map(|f| &mut f[k * b..k * b + chunk.len()]);
        match &e {
            Some(e) => y.iter_mut().zip(chunk.iter().zip(e.iter())).for_each(|(y, (v, e))| *y = v + e),
            None => y.copy_from_slice(chunk),
        }
        let s = max_abs(y.iter().copied());
        let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
        order.clear();
        order.extend((0..chunk.len()).map(|i| i as u16));
        let m = kept(chunk.len(), keep);
        if m < chunk.len() {
            // The m largest magnitudes first, in no particular order; then by index.
            order.select_nth_unstable_by(m - 1, |&a, &b| y[b as usize].abs().total_cmp(&y[a as usize].abs()));
            order.truncate(m);
        }
        order.sort_unstable();
        for &i in &order {
            let c = code(y[usize::from(i)], inv);
            let at = out.indices.len();
            out.codes[at / 4] |= c << (2 * (at % 4));
            out.indices.push(i);
            // What the code does not carry of a value sent; a value not sent stays whole.
            y[usize::from(i)] -= s * LEVELS[usize::from(c)];
        }
        if let Some(e) = e {
            e.copy_from_slice(y);
        }
        out.scales.push(s);
    }
    out
}

/// A `topk` message as the values it stands for, zeros where nothing was sent: refused when it
/// stands for more than `max_len` values, when its blocks, scales, indices (read by `index`) or
/// codes do not match its length, or when an index is outside its block or does not rise.
pub(super) fn decode<I>(
    (len, block, keep): (u64, u32, u32),
    scales: &[f32],
    (indices, index): (&[I], impl Fn(&I) -> u16),
    codes: &[u8],
    max_len: usize,
) -> Result<Vec<f32>, TransportError> {
    let bad = |why: String| TransportError::BadFrame(format!("a topk payload of {len} values {why}"));
    let len = usize::try_from(len).ok().filter(|&n| n <= max_len).ok_or_else(|| {
        bad(format!("stands for more than {max_len}, as many as a frame of the size limit carries as f32"))
    })?;
    check_scales("topk", (block, MAX_BLOCK), scales, len)?;
    if keep == 0 || keep > block {
        return Err(bad(format!("keeps {keep} of each block of {block}; it must keep 1 to {block}")));
    }
    let n = entries(len, block, keep);
    if indices.len() != n || codes.len() != n.div_ceil(4) {
        return Err(bad(format!(
            "keeping {keep} of each block of {block} has {} indices and {} code bytes, not {n} and {}",
            indices.len(),
            codes.len(),
            n.div_ceil(4)
        )));
    }
    let b = block as usize;
    let mut out = vec![0.0_f32; len];
    let mut at = 0;
    for (k, s) in scales.iter().enumerate() {
        let values = &mut out[k * b..(k * b + b).min(len)];
        let mut last = None;
        for _ in 0..kept(values.len(), keep) {
            let i = index(&indices[at]);
            if usize::from(i) >= values.len() || last.is_some_and(|l| i <= l) {
                return Err(bad(format!(
                    "has index {i} in block {k} of {} values after {last:?}; indices rise within a block",
                    values.len()
                )));
            }
            last = Some(i);
            let c = (codes[at / 4] >> (2 * (at % 4))) & 3;
            values[usize::from(i)] = s * LEVELS[usize::from(c)];
            at += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoded(s: &Sparse, len: usize) -> Result<Vec<f32>, TransportError> {
        decode((len as u64, s.block, s.keep), &s.scales, (&s.indices, |&i| i), &s.codes, len)
    }

    #[test]
    fn the_largest_of_each_block_are_sent_on_the_grid_of_its_scale() {
        let v = [0.1, -3.0, 0.2, 1.1, /* block 2 */ 0.0, 0.5, -0.4, 0.05, /* block 3 */ 2.0];
        let s = encode(&v, 4, 2, None);
        assert_eq!((s.block, s.keep), (4, 2));
        assert_eq!(s.scales, [3.0, 0.5, 2.0]);
        assert_eq!(s.indices, [1, 3, 1, 2, 0], "two per block by magnitude, by index within it");
        // −3 → −s; 1.1/3 ≈ 0.37 → +s/3; 0.5 → +s; −0.4/0.5 = −0.8 → −s; 2 → +s.
        assert_eq!(s.codes, [0b00_11_10_00, 0b11]);
        let back = decoded(&s, v.len()).unwrap();
        assert_eq!(back, [0.0, -3.0, 0.0, 1.0, 0.0, 0.5, -0.5, 0.0, 2.0]);
        assert_eq!(entries(9, 4, 2), 5);
        assert_eq!(entries(9, 4, 8), 9, "a block keeps at most all of its values");
    }

    #[test]
    fn error_feedback_sends_everything_in_the_end() {
        let g: Vec<f32> = (0..1000).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013).collect();
        let mut e = vec![0.0_f32; g.len()];
        let mut sent = vec![0.0_f64; g.len()];
        let steps = 400;
        for _ in 0..steps {
            let before = e.clone();
            let s = encode(&g, 64, 2, Some(&mut e));
            let d = decoded(&s, g.len()).unwrap();
            for i in 0..g.len() {
                // What was sent plus the new residue is the value plus the old residue, to the
                // rounding of one f32 subtraction.
                let (lhs, rhs) = (d[i] + e[i], g[i] + before[i]);
                let ulps = 2.0 * f32::EPSILON * (d[i].abs() + rhs.abs()).max(1e-3);
                assert!((lhs - rhs).abs() <= ulps, "{lhs} vs {rhs}");
                sent[i] += f64::from(d[i]);
            }
        }
        // 2 of 64 per message: every value is sent, late, and the residue stays bounded.
        for i in 0..g.len() {
            let carried = f64::from(g[i]) * f64::from(steps) - sent[i];
            assert!((carried - f64::from(e[i])).abs() < 1e-2, "{i}: {carried} vs {}", e[i]);
            assert!(e[i].abs() < 64.0, "{i}: the residue {} grows without bound", e[i]);
        }
    }

    #[test]
    fn malformed_messages_are_refused_before_anything_is_allocated_for_them() {
        let s = encode(&[1.0, -2.0, 3.0, 0.5, 0.25], 2, 1, None);
        assert_eq!(s.indices, [1, 0, 0]);
        let bad =
            |what: &str, len: u64, block, keep, scales: &[f32], idx: &[u16], codes: &[u8], max| match decode(
                (len, block, keep),
                scales,
                (idx, |&i| i),
                codes,
                max,
            ) {
                Err(TransportError::BadFrame(why)) => assert!(why.contains(what), "{why}"),
                other => panic!("accepted ({what}): {other:?}"),
            };
        let (sc, ix, co) = (&s.scales[..], &s.indices[..], &s.codes[..]);
        bad("stands for more than 4", 5, 2, 1, sc, ix, co, 4);
        bad("stands for more than", u64::MAX, 2, 1, sc, ix, co, 1 << 40);
        bad("blocks of 0", 5, 0, 1, sc, ix, co, 5);
        bad("blocks of 65537", 5, MAX_BLOCK + 1, 1, sc, ix, co, 5);
        bad("has 2 scales, not 3", 5, 2, 1, &sc[..2], ix, co, 5);
        bad("scale NaN", 5, 2, 1, &[1.0, f32::NAN, 1.0], ix, co, 5);
        bad("keeps 0", 5, 2, 0, sc, ix, co, 5);
        bad("keeps 3 of each block of 2", 5, 2, 3, sc, ix, co, 5);
        bad("has 2 indices", 5, 2, 1, sc, &ix[..2], co, 5);
        bad("0 code bytes", 5, 2, 1, sc, ix, &[], 5);
        bad("has index 2 in block 0 of 2 values", 5, 2, 1, sc, &[2, 0, 0], co, 5);
        bad("has index 1 in block 2 of 1 values", 5, 2, 1, sc, &[1, 0, 1], co, 5);
        let two = encode(&[1.0, 2.0, 3.0, 4.0], 4, 2, None);
        bad("has index 2 in block 0 of 4 values after Some(3)", 4, 4, 2, &two.scales, &[3, 2], &two.codes, 4);
        bad("has index 3 in block 0 of 4 values after Some(3)", 4, 4, 2, &two.scales, &[3, 3], &two.codes, 4);
        assert_eq!(decoded(&s, 5).unwrap(), [0.0, -2.0, 3.0, 0.0, 0.25]);
        assert_eq!(decode((0, 2, 1), &[], (&[] as &[u16], |&i| i), &[], 0).unwrap(), Vec::<f32>::new());
    }
}
