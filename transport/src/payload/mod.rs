//! Float payloads as they travel: `f32` as is, or compressed by a [`Codec`] (`bf16`, `fp16`
//! with a scale per block, `int8` with a scale per block, `topk`: a few values per block). Senders encode straight from their
//! values ([`Payload::encode`]), with error feedback where a codec keeps fewer than 16 bits;
//! receivers check a payload once and decode it into the `f32` values the shard applies or the
//! learner computes on ([`Payload::decode`]). An `f32` payload is never copied: it stays a
//! view of the values it was made from, or of the frame it arrived in.

use std::str::FromStr;
use std::sync::Arc;

use bytes::Bytes;
use half::f16;
use rkyv::rancor::Fallible;
use rkyv::rend::{f32_le, u16_le};
use rkyv::ser::{Allocator, Writer};
use rkyv::util::AlignedVec;
use rkyv::vec::{ArchivedVec, VecResolver};
use rkyv::with::{ArchiveWith, DeserializeWith, SerializeWith};
use rkyv::{Archive, Deserialize, Place, Serialize};

use rudra_proto::floats::AsFloatVec;

use crate::{Floats, TransportError};
use blocks::{check_scales, max_abs};

mod blocks;
pub mod topk;

/// How float values are encoded on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Codec {
    /// 32-bit floats, exactly.
    #[default]
    F32,
    /// bfloat16: the top 16 bits of each f32, rounded to nearest even.
    Bf16,
    /// IEEE half precision of each value divided by its block's largest magnitude (one f32
    /// scale per block).
    Fp16,
    /// 8-bit integers: per block one f32 scale s = max|x| / 127 and q = round(x / s), to
    /// nearest even.
    Int8,
    /// Sparse: per block the [`Encoding::keep`] largest magnitudes, each as its index in the
    /// block and a 2-bit code on the grid {−s, −s/3, +s/3, +s} of the block's largest
    /// magnitude s ([`topk`]). For gradients and what adds up like them.
    #[serde(rename = "topk")]
    TopK,
}

impl Codec {
    /// Every codec, in the order the configuration lists them.
    pub const ALL: [Self; 5] = [Self::F32, Self::Bf16, Self::Fp16, Self::Int8, Self::TopK];

    /// The codec as the configuration names it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::Fp16 => "fp16",
            Self::Int8 => "int8",
            Self::TopK => "topk",
        }
    }

    /// Whether what it loses should be carried into the next message (error feedback): true
    /// below 16 bits per value.
    #[must_use]
    pub fn needs_feedback(self) -> bool {
        matches!(self, Self::Int8 | Self::TopK)
    }
}

impl std::fmt::Display for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Codec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|c| c.as_str() == s).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|c| c.as_str()).collect();
            format!("unknown codec {s:?}; use one of {}", names.join(", "))
        })
    }
}

/// Values per scale of the block codecs (`fp16`, `int8`) unless configured otherwise.
pub const DEFAULT_BLOCK: u32 = 256;

/// The largest block a receiver accepts.
pub const MAX_BLOCK: u32 = 1 << 20;

/// Values `topk` keeps of a block of [`DEFAULT_BLOCK`] unless configured otherwise: 2%.
pub const DEFAULT_KEEP: u32 = DEFAULT_BLOCK.div_ceil(50);

/// A codec and its block size: how one kind of payload is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Encoding {
    /// The codec.
    pub codec: Codec,
    /// Values per scale (`fp16`, `int8`, `topk`), 1 ..= [`MAX_BLOCK`] (`topk`: at most
    /// [`topk::MAX_BLOCK`]).
    pub block: u32,
    /// `topk`: values kept per block, 1 ..= `block`.
    #[serde(default = "default_keep")]
    pub keep: u32,
}

fn default_keep() -> u32 {
    DEFAULT_KEEP
}

impl Default for Encoding {
    fn default() -> Self {
        Self { codec: Codec::F32, block: DEFAULT_BLOCK, keep: DEFAULT_KEEP }
    }
}

impl Encoding {
    /// Encode `values` ([`Payload::encode`]).
    #[must_use]
    pub fn encode(self, values: &Floats, feedback: Option<&mut [f32]>) -> Payload {
        Payload::encode(self, values, feedback)
    }

    /// The bytes of `len` values encoded so: what [`Payload::bytes`] of them is.
    #[must_use]
    pub fn bytes(self, len: usize) -> usize {
        let scales = 4 * len.div_ceil(self.block.clamp(1, MAX_BLOCK) as usize);
        match self.codec {
            Codec::F32 => 4 * len,
            Codec::Bf16 => 2 * len,
            Codec::Fp16 => 2 * len + scales,
            Codec::Int8 => len + scales,
            Codec::TopK => {
                let block = self.block.clamp(1, topk::MAX_BLOCK);
                let n = topk::entries(len, block, self.keep.clamp(1, block));
                4 * len.div_ceil(block as usize) + 2 * n + n.div_ceil(4)
            }
        }
    }

    /// `values` as a receiver of them decodes them: what compression leaves of them. The
    /// values themselves, shared, for `f32`.
    #[must_use]
    pub fn round_trip(self, values: &Floats) -> Floats {
        match self.codec {
            Codec::F32 => values.clone(),
            _ => self.encode(values, None).decode().unwrap_or_else(|_| values.clone()),
        }
    }
}

/// How a job's payloads travel (`transport.gradient_codec`, `transport.weight_codec`,
/// `transport.codec_block`): every node of the job uses the same.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Codecs {
    /// Gradients and what adds up like them (DOWNPOUR's accumulated update, MDOWNPOUR's
    /// gradient): error feedback below 16 bits.
    pub gradients: Encoding,
    /// Weights, centers and the EASGD family's local parameters.
    pub weights: Encoding,
}

/// Codes shared without copying: a compressed payload is cloned for every learner a shard
/// serves and kept by a learner for a retry, so its clones share one buffer.
pub type Codes<T> = Arc<Vec<T>>;

/// [`Codes`] seen as their bytes.
struct CodeBytes<T>(Codes<T>);

impl<T: bytemuck::Pod> AsRef<[u8]> for CodeBytes<T> {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

/// Archives [`Codes`] exactly as rkyv archives a `Vec`: sharing is local to a process and
/// leaves the wire format as it is.
#[derive(Debug)]
pub struct AsCodes;

impl<T: Archive> ArchiveWith<Codes<T>> for AsCodes {
    type Archived = ArchivedVec<T::Archived>;
    type Resolver = VecResolver;

    fn resolve_with(field: &Codes<T>, resolver: VecResolver, out: Place<Self::Archived>) {
        ArchivedVec::resolve_from_len(field.len(), resolver, out);
    }
}

impl<T, S> SerializeWith<Codes<T>, S> for AsCodes
where
    T: Serialize<S>,
    S: Fallible + Allocator + Writer + ?Sized,
{
    fn serialize_with(field: &Codes<T>, serializer: &mut S) -> Result<VecResolver, S::Error> {
        ArchivedVec::serialize_from_slice(field.as_slice(), serializer)
    }
}

impl<T, D> DeserializeWith<ArchivedVec<T::Archived>, Codes<T>, D> for AsCodes
where
    T: Archive,
    T::Archived: Deserialize<T, D>,
    D: Fallible + ?Sized,
{
    fn deserialize_with(field: &ArchivedVec<T::Archived>, d: &mut D) -> Result<Codes<T>, D::Error> {
        Ok(Arc::new(field.iter().map(|c| c.deserialize(d)).collect::<Result<Vec<T>, _>>()?))
    }
}

/// Float values as they travel: `f32`, or compressed. Clones share the values or the codes.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[rkyv(derive(Debug))]
pub enum Payload {
    /// The values as they are.
    F32(#[rkyv(with = AsFloatVec)] Floats),
    /// bfloat16 bit patterns.
    Bf16(#[rkyv(with = AsCodes)] Codes<u16>),
    /// IEEE half-precision bit patterns of the values divided by their block's scale.
    Fp16 {
        /// Values per scale.
        block: u32,
        /// Each block's largest magnitude.
        #[rkyv(with = AsCodes)]
        scales: Codes<f32>,
        /// The scaled values.
        #[rkyv(with = AsCodes)]
        values: Codes<u16>,
    },
    /// Integers in [-127, 127]; a value is its integer times its block's scale.
    Int8 {
        /// Values per scale.
        block: u32,
        /// Each block's scale, max|x| / 127.
        #[rkyv(with = AsCodes)]
        scales: Codes<f32>,
        /// The integers.
        #[rkyv(with = AsCodes)]
        values: Codes<i8>,
    },
    /// The largest magnitudes of each block, on a 2-bit grid of the block's scale ([`topk`]).
    TopK {
        /// Values it stands for: zeros where nothing was sent.
        len: u64,
        /// Values per block.
        block: u32,
        /// Values kept per block (all of a shorter last block when it holds fewer).
        keep: u32,
        /// Each block's largest magnitude.
        #[rkyv(with = AsCodes)]
        scales: Codes<f32>,
        /// The kept values' indices within their block, rising within each block.
        #[rkyv(with = AsCodes)]
        indices: Codes<u16>,
        /// Their 2-bit codes, four to a byte, the first in the lowest bits.
        #[rkyv(with = AsCodes)]
        codes: Codes<u8>,
    },
}

impl From<Floats> for Payload {
    fn from(values: Floats) -> Self {
        Self::F32(values)
    }
}

impl From<Vec<f32>> for Payload {
    fn from(values: Vec<f32>) -> Self {
        Self::F32(values.into())
    }
}

impl Payload {
    /// `values` encoded with `encoding`. With `feedback` (as long as `values`), a codec below
    /// 16 bits sends `values + feedback` and leaves in `feedback` what that lost, so the sum of
    /// what was sent and the feedback equals the sum of the true values; other codecs leave it
    /// as it is.
    ///
    /// # Panics
    /// If `feedback` is not as long as `values`.
    #[must_use]
    pub fn encode(encoding: Encoding, values: &Floats, feedback: Option<&mut [f32]>) -> Self {
        let block = encoding.block.clamp(1, MAX_BLOCK) as usize;
        match encoding.codec {
            Codec::F32 => Self::F32(values.clone()),
            Codec::Bf16 => Self::Bf16(Arc::new(values.iter().map(|&v| to_bf16(v)).collect())),
            Codec::Fp16 => {
                let mut scales = Vec::with_capacity(values.len().div_ceil(block));
                let mut out = Vec::with_capacity(values.len());
                for chunk in values.chunks(block) {
                    let s = max_abs(chunk.iter().copied());
                    let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
                    out.extend(chunk.iter().map(|&v| f16::from_f32(v * inv).to_bits()));
                    scales.push(s);
                }
                Self::Fp16 { block: block as u32, scales: Arc::new(scales), values: Arc::new(out) }
            }
            Codec::Int8 => {
                let mut scales = Vec::with_capacity(values.len().div_ceil(block));
                let mut out = Vec::with_capacity(values.len());
                match feedback {
                    None => {
                        for chunk in values.chunks(block) {
                            scales.push(quantize(chunk.iter().copied(), &mut out));
                        }
                    }
                    Some(e) => {
                        assert_eq!(e.len(), values.len(), "feedback must be as long as the values");
                        for (chunk, e) in values.chunks(block).zip(e.chunks_mut(block)) {
                            let y = chunk.iter().zip(e.iter()).map(|(v, e)| v + e);
                            let start = out.len();
                            let s = quantize(y, &mut out);
                            // e ← (v + e) − s·q: what this message could not carry.
                            for ((e, v), q) in e.iter_mut().zip(chunk).zip(&out[start..]) {
                                *e = (v + *e) - s * f32::from(*q);
                            }
                            scales.push(s);
                        }
                    }
                }
                Self::Int8 { block: block as u32, scales: Arc::new(scales), values: Arc::new(out) }
            }
            Codec::TopK => {
                let s = topk::encode(values, encoding.block, encoding.keep, feedback);
                Self::TopK {
                    len: values.len() as u64,
                    block: s.block,
                    keep: s.keep,
                    scales: Arc::new(s.scales),
                    indices: Arc::new(s.indices),
                    codes: Arc::new(s.codes),
                }
            }
        }
    }

    /// The codec it was encoded with.
    #[must_use]
    pub fn codec(&self) -> Codec {
        match self {
            Self::F32(_) => Codec::F32,
            Self::Bf16(_) => Codec::Bf16,
            Self::Fp16 { .. } => Codec::Fp16,
            Self::Int8 { .. } => Codec::Int8,
            Self::TopK { .. } => Codec::TopK,
        }
    }

    /// The bytes of its values where they lie (a block codec's few scales aside): what a frame
    /// sends without copying them.
    pub(crate) fn values_bytes(&self) -> Bytes {
        match self {
            Self::F32(v) => v.as_bytes(),
            Self::Bf16(c) | Self::Fp16 { values: c, .. } => Bytes::from_owner(CodeBytes(Arc::clone(c))),
            Self::Int8 { values, .. } => Bytes::from_owner(CodeBytes(Arc::clone(values))),
            Self::TopK { indices, .. } => Bytes::from_owner(CodeBytes(Arc::clone(indices))),
        }
    }

    /// How many values it holds.
    #[must_use]
    pub fn len(&self) -> usize {
        match self {
            Self::F32(v) => v.len(),
            Self::Bf16(v) | Self::Fp16 { values: v, .. } => v.len(),
            Self::Int8 { values, .. } => values.len(),
            Self::TopK { len, .. } => usize::try_from(*len).unwrap_or(usize::MAX),
        }
    }

    /// Whether it holds no values.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes of its values and scales: what it costs on the wire, before framing.
    #[must_use]
    pub fn bytes(&self) -> usize {
        match self {
            Self::F32(v) => 4 * v.len(),
            Self::Bf16(v) => 2 * v.len(),
            Self::Fp16 { scales, values, .. } => 4 * scales.len() + 2 * values.len(),
            Self::Int8 { scales, values, .. } => 4 * scales.len() + values.len(),
            Self::TopK { scales, indices, codes, .. } => 4 * scales.len() + 2 * indices.len() + codes.len(),
        }
    }

    /// The `f32` values: the same storage for `f32`, decoded into a new buffer otherwise. A
    /// block codec's payload whose scales do not match its length, or hold a NaN, ±Inf or a
    /// negative number, is refused, and so is a `topk` payload whose indices or codes do not.
    pub fn decode(self) -> Result<Floats, TransportError> {
        Ok(match self {
            Self::F32(v) => v,
            Self::Bf16(v) => from_bf16s(&v, |&b| b),
            Self::Fp16 { block, scales, values } => {
                decode_blocks(Codec::Fp16, block, &scales, &values, |&b| f16::from_bits(b).to_f32())?
            }
            Self::Int8 { block, scales, values } => {
                decode_blocks(Codec::Int8, block, &scales, &values, |&q| f32::from(q))?
            }
            Self::TopK { len, block, keep, scales, indices, codes } => {
                topk::decode((len, block, keep), &scales, (&indices, |&i| i), &codes, usize::MAX)?.into()
            }
        })
    }
}

impl ArchivedPayload {
    /// The codec it was encoded with.
    #[must_use]
    pub fn codec(&self) -> Codec {
        match self {
            Self::F32(_) => Codec::F32,
            Self::Bf16(_) => Codec::Bf16,
            Self::Fp16 { .. } => Codec::Fp16,
            Self::Int8 { .. } => Codec::Int8,
            Self::TopK { .. } => Codec::TopK,
        }
    }

    /// The `f32` values of this validated payload in the frame body `frame`: a view into the
    /// frame for `f32`; decoded straight from the frame into a buffer of their own for a
    /// compressed payload, checked as [`Payload::decode`] checks them. A `topk` payload may stand
    /// for at most `max_len` values.
    pub(crate) fn decode_in(
        &self,
        frame: &Arc<AlignedVec>,
        max_len: usize,
    ) -> Result<Floats, TransportError> {
        let scales = |s: &ArchivedVec<f32_le>| s.iter().map(|s| s.to_native()).collect::<Vec<f32>>();
        match self {
            Self::F32(values) => in_frame(frame, values),
            Self::Bf16(v) => Ok(from_bf16s(v, |b| b.to_native())),
            Self::Fp16 { block, scales: s, values } => {
                let fp16 = |b: &u16_le| f16::from_bits(b.to_native()).to_f32();
                decode_blocks(Codec::Fp16, block.to_native(), &scales(s), values, fp16)
            }
            Self::Int8 { block, scales: s, values } => {
                decode_blocks(Codec::Int8, block.to_native(), &scales(s), values, |&q| f32::from(q))
            }
            Self::TopK { len, block, keep, scales: s, indices, codes } => {
                let shape = (len.to_native(), block.to_native(), keep.to_native());
                let index = |i: &u16_le| i.to_native();
                Ok(topk::decode(shape, &scales(s), (indices, index), codes, max_len)?.into())
            }
        }
    }
}

/// bfloat16 codes (read by `bits`) as `f32` values.
fn from_bf16s<C>(codes: &[C], bits: impl Fn(&C) -> u16) -> Floats {
    codes.iter().map(|c| from_bf16(bits(c))).collect::<Vec<f32>>().into()
}

/// A block codec's codes as `f32` values: each `value(code)` times its block's scale, once the
/// scales are checked against the codes.
fn decode_blocks<C>(
    codec: Codec,
    block: u32,
    scales: &[f32],
    codes: &[C],
    value: impl Fn(&C) -> f32,
) -> Result<Floats, TransportError> {
    check_scales(codec.as_str(), (block, MAX_BLOCK), scales, codes.len())?;
    let mut out = Vec::with_capacity(codes.len());
    for (chunk, s) in codes.chunks(block as usize).zip(scales) {
        out.extend(chunk.iter().map(|c| s * value(c)));
    }
    Ok(out.into())
}

/// The bfloat16 bits of `v`: its top 16 bits, rounded to nearest even; a NaN stays a (quiet)
/// NaN. Plain bit arithmetic, so a loop of it vectorises.
fn to_bf16(v: f32) -> u16 {
    let b = v.to_bits();
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    if v.is_nan() { (b >> 16) as u16 | 0x0040 } else { rounded }
}

/// The f32 of bfloat16 bits `b`.
fn from_bf16(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// Append the `int8` codes of `values` (one block) to `out`: round(v / s) to nearest even; the
/// block's scale s.
fn quantize(values: impl Iterator<Item = f32> + Clone, out: &mut Vec<i8>) -> f32 {
    // Adding 1.5 · 2^23 to a number below 2^22 in magnitude rounds it to an integer, to nearest
    // even, and leaves that integer in the low bits of the sum: additions and bit operations,
    // which vectorise where rounding and saturating conversions do not.
    const ROUND: f32 = 12_582_912.0;
    let s = max_abs(values.clone()) / 127.0;
    let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
    let start = out.len();
    out.resize(start + values.clone().count(), 0);
    for (q, v) in out[start..].iter_mut().zip(values) {
        *q = ((v * inv).clamp(-127.0, 127.0) + ROUND).to_bits() as u8 as i8;
    }
    s
}

/// The `f32` payload `values` of the validated frame body `frame`, viewed in place.
pub(crate) fn in_frame(
    frame: &Arc<AlignedVec>,
    values: &ArchivedVec<f32_le>,
) -> Result<Floats, TransportError> {
    Floats::in_frame(frame, values)
        .ok_or_else(|| TransportError::BadFrame("a payload lies outside its frame".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values() -> Floats {
        (0..1000).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013).collect::<Vec<f32>>().into()
    }

    fn encoding(codec: Codec) -> Encoding {
        Encoding { codec, block: 64, keep: 16 }
    }

    #[test]
    fn f32_payloads_share_the_values() {
        let v = values();
        let p = encoding(Codec::F32).encode(&v, None);
        assert_eq!((p.codec(), p.len(), p.bytes()), (Codec::F32, 1000, 4000));
        let back = p.decode().unwrap();
        assert_eq!(back.as_ptr(), v.as_ptr(), "no copy");
    }

    #[test]
    fn each_codec_keeps_the_values_within_its_precision() {
        let v = values();
        for (codec, bytes, tolerance) in [
            (Codec::Bf16, 2000, 1.0 / 256.0),
            (Codec::Fp16, 2000 + 4 * 16, 1.0 / 2048.0),
            (Codec::Int8, 1000 + 4 * 16, 1.0 / 127.0),
        ] {
            let p = encoding(codec).encode(&v, None);
            assert_eq!((p.codec(), p.len(), p.bytes()), (codec, 1000, bytes));
            assert_eq!(encoding(codec).bytes(1000), bytes);
            let back = p.decode().unwrap();
            let max = v.iter().fold(0.0_f32, |m, x| m.max(x.abs()));
            for (a, b) in v.iter().zip(back.iter()) {
                assert!((a - b).abs() <= tolerance * max, "{codec}: {a} became {b}");
            }
        }
    }

    #[test]
    fn topk_sends_a_few_values_per_block_in_a_few_bytes() {
        let v = values();
        let e = encoding(Codec::TopK);
        let p = e.encode(&v, None);
        // 16 blocks of 64 (the last of 40), 16 kept of each: 256 indices of 2 bytes, 256 codes of
        // 2 bits, 16 scales.
        assert_eq!((p.codec(), p.len(), p.bytes()), (Codec::TopK, 1000, 4 * 16 + 2 * 256 + 64));
        assert_eq!(e.bytes(1000), p.bytes());
        let back = p.decode().unwrap();
        assert_eq!(back.len(), 1000);
        assert!(back.iter().filter(|x| **x != 0.0).count() <= 256);
        let mut untouched = vec![0.0; 1000];
        let _ = e.encode(&v, Some(&mut untouched));
        assert!(untouched.iter().filter(|x| **x != 0.0).count() >= 1000 - 256, "what was not sent is kept");
    }

    #[test]
    fn bf16_keeps_the_top_bits_rounded_to_nearest_even() {
        let v: Floats = vec![1.0, 1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, -2.5, 0.0].into();
        let Payload::Bf16(bits) = encoding(Codec::Bf16).encode(&v, None) else { panic!() };
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: it rounds to the even 1.
        assert_eq!(*bits, vec![0x3f80, 0x3f80, 0x3f82, 0xc020, 0]);
        // As the half crate's reference conversion, for every kind of value.
        let mut bits = 0x0000_1234_u32;
        for _ in 0..100_000 {
            bits = bits.wrapping_mul(2_654_435_761).wrapping_add(0x9e37_79b9);
            for v in [f32::from_bits(bits), f32::MAX, -f32::MAX, f32::INFINITY, f32::MIN_POSITIVE / 3.0] {
                let reference = half::bf16::from_f32(v);
                let ours = to_bf16(v);
                assert!(
                    ours == reference.to_bits() || (v.is_nan() && half::bf16::from_bits(ours).is_nan()),
                    "{v}"
                );
                assert_eq!(from_bf16(reference.to_bits()).to_bits(), reference.to_f32().to_bits());
            }
        }
    }

    #[test]
    fn int8_rounds_to_nearest_even() {
        let v: Floats = vec![127.0, 0.5, 1.5, 2.5, -0.5, -1.5, 2.49, -126.51].into();
        let Payload::Int8 { values, .. } =
            Encoding { codec: Codec::Int8, block: 8, ..Encoding::default() }.encode(&v, None)
        else {
            panic!()
        };
        assert_eq!(*values, vec![127, 0, 2, 2, 0, -2, 2, -127]);
    }

    #[test]
    fn int8_scales_by_the_block_maximum() {
        let v: Floats = vec![0.5, -1.27, 0.0, 0.01, 2.54, 0.0, 0.0, 0.0].into();
        let p = Encoding { codec: Codec::Int8, block: 4, ..Encoding::default() }.encode(&v, None);
        let Payload::Int8 { block, scales, values } = &p else { panic!() };
        assert_eq!(*block, 4);
        assert!((scales[0] - 0.01).abs() < 1e-9 && (scales[1] - 0.02).abs() < 1e-9);
        assert_eq!(**values, vec![50, -127, 0, 1, 127, 0, 0, 0]);
    }

    #[test]
    fn error_feedback_carries_what_was_lost_exactly() {
        let mut e = vec![0.0_f32; 1000];
        let mut sent_sum = vec![0.0_f64; 1000];
        let mut true_sum = vec![0.0_f64; 1000];
        for step in 0..20 {
            let g: Floats =
                values().iter().map(|v| v * (1.0 + step as f32 * 0.1)).collect::<Vec<f32>>().into();
            let before: Vec<f32> = e.clone();
            let sent = encoding(Codec::Int8).encode(&g, Some(&mut e)).decode().unwrap();
            for i in 0..1000 {
                // Exactly: what was sent plus the new residue is the value plus the old residue,
                // to the rounding of one f32 subtraction.
                let lhs = sent[i] + e[i];
                let rhs = g[i] + before[i];
                assert!((lhs - rhs).abs() <= f32::EPSILON * rhs.abs().max(1e-3), "{lhs} vs {rhs}");
                sent_sum[i] += f64::from(sent[i]);
                true_sum[i] += f64::from(g[i]);
            }
        }
        for i in 0..1000 {
            let carried = true_sum[i] - sent_sum[i];
            assert!((carried - f64::from(e[i])).abs() < 1e-4, "the residue is what was not sent yet");
        }
        let s = encoding(Codec::Int8).encode(&values(), None);
        assert!(matches!(s, Payload::Int8 { .. }));
        let mut untouched = vec![0.5; 1000];
        let _ = encoding(Codec::Bf16).encode(&values(), Some(&mut untouched));
        assert!(untouched.iter().all(|&x| x == 0.5), "16-bit codecs keep no feedback");
    }

    #[test]
    fn malformed_block_payloads_are_refused() {
        let bad = |p: Payload, what: &str| match p.decode() {
            Err(TransportError::BadFrame(why)) => assert!(why.contains(what), "{why}"),
            other => panic!("accepted: {other:?}"),
        };
        let int8 = |block, scales: Vec<f32>, n| Payload::Int8 {
            block,
            scales: scales.into(),
            values: vec![1; n].into(),
        };
        bad(int8(4, vec![1.0], 8), "has 1 scales, not 2");
        bad(int8(4, vec![1.0, 1.0, 1.0], 8), "has 3 scales, not 2");
        bad(int8(0, vec![], 8), "blocks of 0");
        bad(int8(MAX_BLOCK + 1, vec![1.0], 8), "blocks of");
        bad(int8(4, vec![1.0, f32::NAN], 8), "scale NaN");
        bad(int8(4, vec![f32::INFINITY, 1.0], 8), "scale inf");
        bad(
            Payload::Fp16 { block: 4, scales: vec![-1.0, 1.0].into(), values: vec![0; 8].into() },
            "scale -1",
        );
        assert_eq!(int8(4, vec![0.5, 2.0], 7).decode().unwrap()[..], [0.5, 0.5, 0.5, 0.5, 2.0, 2.0, 2.0]);
    }

    #[test]
    fn codecs_parse_by_name() {
        for c in Codec::ALL {
            assert_eq!(c.as_str().parse::<Codec>(), Ok(c));
        }
        assert!("int4".parse::<Codec>().unwrap_err().contains("f32, bf16, fp16, int8, topk"));
    }
}
