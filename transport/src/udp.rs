//! The UDP socket under QUIC: quinn's own, with its batches kept inside what one UDP send or
//! receive can carry, so packets may grow as large as the path allows.
//!
//! quinn hands the socket up to ten packets in one segmentation-offload send; the kernel
//! refuses a send over 64 KiB, so with packets above ~6.5 KB (loopback, jumbo frames) every
//! batch would be lost. Here such a batch goes out as several sends, each of whole segments
//! within 64 KiB. On the receiving side quinn sizes its buffer for the most packets the kernel
//! may coalesce (64) of the largest size; the kernel never coalesces more than 64 KiB, so the
//! socket reports the segments that fit in that, which keeps the buffer at a few megabytes
//! instead of a hundred. The socket's kernel buffers are asked for here too.

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};

/// The most bytes of segments one send or one coalesced receive carries: an IP datagram's
/// 65,535 bytes less the IPv4 and UDP headers.
const MAX_BATCH: usize = 65_507;

/// Ask the kernel for `bytes` of send and receive buffer on `socket`, warning when it grants
/// less: a receive buffer smaller than the connection window drops bursts on fast paths.
pub(crate) fn socket_buffers(socket: &std::net::UdpSocket, bytes: usize) -> std::io::Result<()> {
    let state = quinn::udp::UdpSocketState::new(socket.into())?;
    state.set_recv_buffer_size(socket.into(), bytes)?;
    state.set_send_buffer_size(socket.into(), bytes)?;
    // Linux reports twice what it grants, the other half being its bookkeeping.
    let granted = state.recv_buffer_size(socket.into())? / if cfg!(target_os = "linux") { 2 } else { 1 };
    if granted < bytes {
        tracing::warn!(
            asked = bytes,
            granted,
            "the kernel granted a smaller UDP receive buffer than asked (raise net.core.rmem_max): \
             fast transfers will lose packets and slow down"
        );
    }
    Ok(())
}

/// quinn's socket for `runtime`, with batches bounded for packets of up to `max_payload` bytes.
pub(crate) fn wrap(
    runtime: &dyn quinn::Runtime,
    socket: std::net::UdpSocket,
    max_payload: u16,
) -> io::Result<Arc<dyn AsyncUdpSocket>> {
    let inner = runtime.wrap_udp_socket(socket)?;
    let receive_segments =
        MAX_BATCH.div_ceil(usize::from(max_payload).max(1)).clamp(1, inner.max_receive_segments());
    Ok(Arc::new(BoundedBatches { inner, receive_segments }))
}

/// quinn's socket, sending oversized batches in parts and reporting the receive segments
/// that fit in 64 KiB.
struct BoundedBatches {
    inner: Arc<dyn AsyncUdpSocket>,
    receive_segments: usize,
}

impl fmt::Debug for BoundedBatches {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundedBatches").field("inner", &self.inner).finish_non_exhaustive()
    }
}

impl AsyncUdpSocket for BoundedBatches {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Arc::clone(&self.inner).create_io_poller()
    }

    /// A batch over [`MAX_BATCH`] goes out in parts of whole segments. When a later part
    /// would block, quinn sends the whole batch again once the socket is writable: the
    /// receiver discards the packets it already has, as it does any duplicate.
    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        let segment = match transmit.segment_size {
            Some(segment) if transmit.contents.len() > MAX_BATCH => segment,
            _ => return self.inner.try_send(transmit),
        };
        let part = (MAX_BATCH / segment).max(1) * segment;
        for contents in transmit.contents.chunks(part) {
            let segment_size = (contents.len() > segment).then_some(segment);
            self.inner.try_send(&Transmit { contents, segment_size, ..transmit.clone() })?;
        }
        Ok(())
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.receive_segments
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;
    use std::net::Ipv4Addr;

    use quinn::Runtime;

    use super::*;

    /// A UDP socket on a free loopback port.
    fn loopback() -> std::net::UdpSocket {
        std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap()
    }

    /// Receive datagrams on `socket` until `want` bytes came, returning each datagram's length.
    async fn receive(socket: &dyn AsyncUdpSocket, want: usize) -> Vec<usize> {
        let mut lengths = Vec::new();
        let mut buf = vec![0u8; 128 << 10];
        while lengths.iter().sum::<usize>() < want {
            let mut meta = [RecvMeta::default()];
            let n = poll_fn(|cx| socket.poll_recv(cx, &mut [IoSliceMut::new(&mut buf)], &mut meta))
                .await
                .unwrap();
            assert_eq!(n, 1);
            let stride = meta[0].stride.max(1);
            let mut left = meta[0].len;
            while left > 0 {
                lengths.push(left.min(stride));
                left -= left.min(stride);
            }
        }
        lengths
    }

    /// Send `transmit` on `socket` once it is writable, as quinn does.
    async fn send(socket: &Arc<dyn AsyncUdpSocket>, transmit: &Transmit<'_>) {
        let mut poller = Arc::clone(socket).create_io_poller();
        loop {
            poll_fn(|cx| poller.as_mut().poll_writable(cx)).await.unwrap();
            match socket.try_send(transmit) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                sent => return sent.unwrap(),
            }
        }
    }

    #[tokio::test]
    async fn a_batch_over_64_kib_arrives_whole_as_separate_sends() {
        let runtime = quinn::TokioRuntime;
        let sender = wrap(&runtime, loopback(), 20_000).unwrap();
        let receiver = wrap(&runtime, loopback(), 20_000).unwrap();
        // Four 20,000-byte packets and a short one: 85,000 bytes, over one send's limit.
        let contents: Vec<u8> = (0..85_000u32).map(|i| (i % 251) as u8).collect();
        let transmit = Transmit {
            destination: receiver.local_addr().unwrap(),
            ecn: None,
            contents: &contents,
            segment_size: Some(20_000),
            src_ip: None,
        };
        if sender.max_transmit_segments() > 1 {
            send(&sender, &transmit).await;
        } else {
            // Without segmentation offload quinn never batches; the parts go one by one.
            for contents in contents.chunks(20_000) {
                send(&sender, &Transmit { contents, segment_size: None, ..transmit.clone() }).await;
            }
        }
        assert_eq!(receive(receiver.as_ref(), contents.len()).await, [20_000, 20_000, 20_000, 20_000, 5_000]);
    }

    #[test]
    fn receive_segments_fill_64_kib_at_most() {
        let runtime = quinn::TokioRuntime;
        let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let _in = tokio.enter();
        let native = runtime.wrap_udp_socket(loopback()).unwrap().max_receive_segments();
        for (payload, segments) in [(65_000, 2), (6_500, 11), (1_452, 46)] {
            let socket = wrap(&runtime, loopback(), payload).unwrap();
            assert_eq!(socket.max_receive_segments(), segments.min(native));
        }
    }
}
