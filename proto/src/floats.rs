//! [`Floats`]: immutable `f32` values shared without copying, whether they were computed in
//! this process or arrived in a validated receive buffer.

use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;

use bytes::Bytes;
use rkyv::Place;
use rkyv::rancor::Fallible;
use rkyv::rend::f32_le;
use rkyv::ser::{Allocator, Writer};
use rkyv::util::AlignedVec;
use rkyv::vec::{ArchivedVec, VecResolver};
use rkyv::with::{ArchiveWith, DeserializeWith, SerializeWith};

#[cfg(not(target_endian = "little"))]
compile_error!("Rudra's zero-copy payload views need a little-endian target");

/// A cheaply cloned, immutable run of `f32` values: a range of a local vector, or a payload
/// viewed in place in the frame it arrived in. Dereferences to `&[f32]`.
#[derive(Clone)]
pub struct Floats {
    owner: Owner,
    /// First value (a float index for [`Owner::Vec`], a byte offset for [`Owner::Frame`]).
    offset: usize,
    len: usize,
}

#[derive(Clone)]
enum Owner {
    Vec(Arc<Vec<f32>>),
    Frame(Arc<AlignedVec>),
}

impl Floats {
    /// The float payload `values` of the validated frame body `buf`, viewed in place; `None`
    /// when `values` does not lie inside `buf`, 4-aligned.
    #[must_use]
    pub fn in_frame(buf: &Arc<AlignedVec>, values: &ArchivedVec<f32_le>) -> Option<Self> {
        let offset = (values.as_ptr() as usize).checked_sub(buf.as_ptr() as usize)?;
        let end = offset.checked_add(values.len().checked_mul(4)?)?;
        (end <= buf.len() && offset % 4 == 0).then(|| Self {
            owner: Owner::Frame(Arc::clone(buf)),
            offset,
            len: values.len(),
        })
    }

    /// The values `range` of these, sharing the same storage; `None` when out of bounds.
    #[must_use]
    pub fn slice(&self, range: Range<usize>) -> Option<Self> {
        if range.start > range.end || range.end > self.len {
            return None;
        }
        let offset = match self.owner {
            Owner::Vec(_) => self.offset + range.start,
            Owner::Frame(_) => self.offset + 4 * range.start,
        };
        Some(Self { owner: self.owner.clone(), offset, len: range.len() })
    }

    /// The values' bytes, sharing their storage.
    #[must_use]
    pub fn as_bytes(&self) -> Bytes {
        Bytes::from_owner(FloatBytes(self.clone()))
    }

    /// The local vector behind these values when they are all of it.
    #[must_use]
    pub fn whole_vec(&self) -> Option<&Arc<Vec<f32>>> {
        match &self.owner {
            Owner::Vec(v) if self.offset == 0 && self.len == v.len() => Some(v),
            _ => None,
        }
    }
}

/// [`Floats`] seen as their bytes.
struct FloatBytes(Floats);

impl AsRef<[u8]> for FloatBytes {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

impl Deref for Floats {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        match &self.owner {
            Owner::Vec(v) => &v[self.offset..self.offset + self.len],
            Owner::Frame(buf) => {
                let bytes = &buf[self.offset..self.offset + 4 * self.len];
                // SAFETY: `bytes` is the storage of an `ArchivedVec<f32_le>` that rkyv
                // validated in this buffer (in bounds, 4-aligned), or a sub-range of it;
                // `f32_le` is `repr(C)` over `f32` and holds the native value on this
                // little-endian target; the buffer is immutable behind the Arc.
                unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<f32>(), self.len) }
            }
        }
    }
}

impl From<Arc<Vec<f32>>> for Floats {
    fn from(v: Arc<Vec<f32>>) -> Self {
        let len = v.len();
        Self { owner: Owner::Vec(v), offset: 0, len }
    }
}

impl From<Vec<f32>> for Floats {
    fn from(v: Vec<f32>) -> Self {
        Arc::new(v).into()
    }
}

/// Archives [`Floats`] exactly as rkyv archives a `Vec<f32>`, straight from where the values
/// are: a message carrying them is encoded without first copying them into a vector of its own,
/// and its receiver sees an ordinary archived vector.
#[derive(Debug)]
pub struct AsFloatVec;

impl ArchiveWith<Floats> for AsFloatVec {
    type Archived = ArchivedVec<f32_le>;
    type Resolver = VecResolver;

    fn resolve_with(field: &Floats, resolver: VecResolver, out: Place<Self::Archived>) {
        ArchivedVec::resolve_from_len(field.len(), resolver, out);
    }
}

impl<S: Fallible + Allocator + Writer + ?Sized> SerializeWith<Floats, S> for AsFloatVec {
    fn serialize_with(field: &Floats, serializer: &mut S) -> Result<VecResolver, S::Error> {
        ArchivedVec::serialize_from_slice(&field[..], serializer)
    }
}

impl<D: Fallible + ?Sized> DeserializeWith<ArchivedVec<f32_le>, Floats, D> for AsFloatVec {
    fn deserialize_with(field: &ArchivedVec<f32_le>, _: &mut D) -> Result<Floats, D::Error> {
        Ok(field.iter().map(|v| v.to_native()).collect::<Vec<f32>>().into())
    }
}

impl PartialEq for Floats {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl fmt::Debug for Floats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Floats({} values)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_share_storage_and_check_bounds() {
        let v = Arc::new(vec![0.0, 1.0, 2.0, 3.0, 4.0]);
        let all = Floats::from(Arc::clone(&v));
        assert!(Arc::ptr_eq(all.whole_vec().unwrap(), &v));
        let mid = all.slice(1..4).unwrap();
        assert_eq!(&*mid, &[1.0, 2.0, 3.0]);
        assert_eq!(mid.as_ptr(), v[1..].as_ptr(), "a slice is a view, not a copy");
        assert!(mid.whole_vec().is_none());
        assert_eq!(&*mid.slice(1..3).unwrap(), &[2.0, 3.0]);
        assert!(mid.slice(2..4).is_none());
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = all.slice(3..2);
        assert!(reversed.is_none());
    }
}
