//! The one frame reader: a header checked against the size limit and the link's roles before
//! anything is allocated, then the body, validated once into an [`Inbound`].
//!
//! The network reads a QUIC stream through it and the fuzzer and tests read byte slices
//! through it ([`decode_frame`]), so what the fuzzer checks is what a node runs.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use rkyv::util::AlignedVec;

use crate::frame::{HEADER_LEN, Header};
use crate::{Inbound, Kind, Role, TransportError};

/// Where a frame's bytes come from: a QUIC receive stream, or a byte slice.
pub trait FrameSource {
    /// Fill `header`; `Ok(false)` when the source ended cleanly before its first byte.
    fn read_header(
        &mut self,
        header: &mut [u8; HEADER_LEN],
    ) -> impl Future<Output = Result<bool, TransportError>> + Send;

    /// Up to `max` further bytes; `None` when the source has ended.
    fn read_chunk(
        &mut self,
        max: usize,
    ) -> impl Future<Output = Result<Option<Bytes>, TransportError>> + Send;
}

/// What a link accepts: who sends on it, who receives, and the largest body.
#[derive(Clone, Copy, Debug)]
pub struct Accepts<'a> {
    /// The sending peer's node name, for messages.
    pub from_name: &'a str,
    /// The sending peer's role.
    pub from: Role,
    /// This node's role.
    pub to: Role,
    /// The largest body accepted, in bytes.
    pub max_body: u32,
}

impl Accepts<'static> {
    /// A link from the first role that may send `kind` to the first that may receive it,
    /// with a 64 MiB limit: for tests and the fuzzer's seeds.
    #[must_use]
    pub fn for_kind(kind: Kind) -> Self {
        Self { from_name: "peer", from: kind.senders()[0], to: kind.receivers()[0], max_body: 64 << 20 }
    }
}

/// Read one frame from `source`, or `None` at a clean end between frames. A header over the
/// limit, of a kind the sender may not send or this node may not receive, a short body or a
/// body failing validation is an error, found before the body is allocated where the header
/// alone shows it.
pub async fn read_frame<S: FrameSource>(
    source: &mut S,
    accepts: &Accepts<'_>,
) -> Result<Option<Inbound>, TransportError> {
    let mut header = [0u8; HEADER_LEN];
    if !source.read_header(&mut header).await? {
        return Ok(None);
    }
    let h = Header::decode(&header, accepts.max_body)?;
    if !h.kind.senders().contains(&accepts.from) || !h.kind.receivers().contains(&accepts.to) {
        return Err(TransportError::BadFrame(format!(
            "a {:?} from {} ({}) is not accepted by a {}",
            h.kind,
            accepts.from_name,
            accepts.from.as_str(),
            accepts.to.as_str()
        )));
    }
    // Chunks as they arrive, appended: the body is copied once out of the source and never
    // zero-filled first.
    let len = h.body_len as usize;
    let mut body = AlignedVec::with_capacity(len);
    while body.len() < len {
        match source.read_chunk(len - body.len()).await? {
            Some(chunk) => body.extend_from_slice(&chunk),
            None => {
                return Err(TransportError::BadFrame(format!(
                    "a {:?} body of {} bytes is truncated: the stream ended after {}",
                    h.kind,
                    h.body_len,
                    body.len()
                )));
            }
        }
    }
    Inbound::decode(h.kind, body, accepts.max_body).map(Some)
}

impl FrameSource for &[u8] {
    async fn read_header(&mut self, header: &mut [u8; HEADER_LEN]) -> Result<bool, TransportError> {
        if self.is_empty() {
            return Ok(false);
        }
        let (head, rest) = self
            .split_first_chunk::<HEADER_LEN>()
            .ok_or_else(|| TransportError::BadFrame(format!("truncated header: {} bytes", self.len())))?;
        header.copy_from_slice(head);
        *self = rest;
        Ok(true)
    }

    async fn read_chunk(&mut self, max: usize) -> Result<Option<Bytes>, TransportError> {
        if self.is_empty() {
            return Ok(None);
        }
        let (chunk, rest) = self.split_at(max.min(self.len()));
        *self = rest;
        Ok(Some(Bytes::copy_from_slice(chunk)))
    }
}

/// Read exactly one whole frame from `bytes` through [`read_frame`], as a node would read it
/// from a peer that `accepts` describes; bytes after the frame are an error. For tests and the
/// fuzzer.
pub fn decode_frame(mut bytes: &[u8], accepts: &Accepts<'_>) -> Result<Inbound, TransportError> {
    // A slice never makes the reader wait, so one poll finishes it.
    let read = {
        let read = pin!(read_frame(&mut bytes, accepts));
        match read.poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(read) => read,
            Poll::Pending => Err(TransportError::BadFrame("a byte slice made the frame reader wait".into())),
        }
    };
    let inbound = read?.ok_or_else(|| TransportError::BadFrame("no frame: 0 bytes".into()))?;
    if !bytes.is_empty() {
        return Err(TransportError::BadFrame(format!("{} bytes after the frame", bytes.len())));
    }
    Ok(inbound)
}

/// The roles of a link as the fuzzer's first input byte names them (`b % 16`: sender `b / 4`,
/// receiver `b % 4`, each of scheduler, shard, learner, aggregator), so that the role check is
/// fuzzed too.
const ROLES: [Role; 4] = [Role::Scheduler, Role::Shard, Role::Learner, Role::Aggregator];

/// Read a fuzzer's input: one byte naming the link's roles, then one whole frame, through
/// [`read_frame`] with a 1 MiB limit.
pub fn decode_fuzz_input(input: &[u8]) -> Result<Inbound, TransportError> {
    let Some((&link, frame)) = input.split_first() else {
        return Err(TransportError::BadFrame("empty input".into()));
    };
    let link = usize::from(link % 16);
    let accepts =
        Accepts { from_name: "fuzz", from: ROLES[link / 4], to: ROLES[link % 4], max_body: 1 << 20 };
    decode_frame(frame, &accepts)
}

/// A fuzzer's input that carries `frame`, of `kind`, over a link that accepts it: the seed
/// corpus is made of these.
#[must_use]
pub fn fuzz_input(kind: Kind, frame: &[u8]) -> Vec<u8> {
    let Accepts { from, to, .. } = Accepts::for_kind(kind);
    let index = |r| ROLES.iter().position(|&x| x == r).unwrap_or(0) as u8;
    let mut input = vec![index(from) * 4 + index(to)];
    input.extend_from_slice(frame);
    input
}
