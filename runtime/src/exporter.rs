//! `--metrics-addr`: a node's [`Metrics`] served at `/metrics` in the Prometheus text format
//! by a minimal HTTP/1.1 responder on tokio (one request per connection).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rudra_actors::metrics::Metrics;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::RuntimeError;
use rudra_actors::InvalidSetting;

/// The largest request head read; longer requests are answered 431.
const MAX_HEAD: usize = 8 << 10;
/// A client that has not sent its request head by then is hung up on.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The content type of the text exposition format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A bound metrics endpoint, not yet serving.
#[derive(Debug)]
pub struct MetricsEndpoint {
    listener: std::net::TcpListener,
    addr: SocketAddr,
}

impl MetricsEndpoint {
    /// Listen on `addr`. Done before a node starts, so a taken port fails at once.
    pub fn bind(addr: SocketAddr) -> Result<Self, RuntimeError> {
        let invalid = |e: std::io::Error| {
            RuntimeError::Invalid(InvalidSetting::new(
                "--metrics-addr",
                format!("cannot listen on {addr}: {e}; choose a free address"),
            ))
        };
        let listener = std::net::TcpListener::bind(addr).map_err(invalid)?;
        listener.set_nonblocking(true).map_err(invalid)?;
        let addr = listener.local_addr().map_err(invalid)?;
        Ok(Self { listener, addr })
    }

    /// Bind `addr` when one is given.
    pub fn bind_if(addr: Option<SocketAddr>) -> Result<Option<Self>, RuntimeError> {
        addr.map(Self::bind).transpose()
    }

    /// Serve a fresh registry until the runtime stops; returns it for the node's actors to
    /// record into. Must be called inside a tokio runtime (an actix `System` is one).
    pub fn start(self) -> Result<Arc<Metrics>, RuntimeError> {
        let listener = TcpListener::from_std(self.listener).map_err(|e| {
            RuntimeError::Invalid(InvalidSetting::new(
                "--metrics-addr",
                format!("cannot serve on {}: {e}", self.addr),
            ))
        })?;
        let metrics = Arc::new(Metrics::new());
        tracing::info!("serving metrics at http://{}/metrics", self.addr);
        tokio::spawn(serve(listener, Arc::clone(&metrics)));
        Ok(metrics)
    }
}

async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(answer(stream, Arc::clone(&metrics)));
            }
            // Out of file descriptors and the like: let the moment pass.
            Err(e) => {
                tracing::warn!("metrics endpoint: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn answer(mut stream: TcpStream, metrics: Arc<Metrics>) {
    let Ok(Ok(head)) = tokio::time::timeout(READ_TIMEOUT, read_head(&mut stream)).await else {
        return;
    };
    let response = respond(head.as_deref(), &metrics);
    // A client that went away needs no answer.
    let _ = stream.write_all(&response).await;
    let _ = stream.shutdown().await;
}

/// The request head up to its blank line; `None` if it exceeds [`MAX_HEAD`].
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<Vec<u8>>> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > MAX_HEAD {
            return Ok(None);
        }
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    Ok(Some(head))
}

/// The whole response to a request head (`None`: too long).
fn respond(head: Option<&[u8]>, metrics: &Metrics) -> Vec<u8> {
    let Some(head) = head else {
        return reply("431 Request Header Fields Too Large", "", "the request head is too long\n");
    };
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next()) else {
        return reply("400 Bad Request", "", "expected an HTTP/1.1 request line\n");
    };
    if !version.starts_with("HTTP/1.") {
        return reply("505 HTTP Version Not Supported", "", "only HTTP/1.x is spoken here\n");
    }
    let path = target.split('?').next().unwrap_or_default();
    let response = match (method, path) {
        ("GET" | "HEAD", "/metrics") => {
            let body = metrics.render();
            let mut r = reply_head("200 OK", CONTENT_TYPE, "", body.len());
            if method == "GET" {
                r.extend_from_slice(body.as_bytes());
            }
            return r;
        }
        ("GET" | "HEAD", _) => ("404 Not Found", "", "not found; the metrics are at /metrics\n"),
        _ => ("405 Method Not Allowed", "Allow: GET, HEAD\r\n", "only GET and HEAD are served\n"),
    };
    reply(response.0, response.1, response.2)
}

/// A plain-text response with `body`; `extra` holds further header lines.
fn reply(status: &str, extra: &str, body: &str) -> Vec<u8> {
    let mut r = reply_head(status, "text/plain; charset=utf-8", extra, body.len());
    r.extend_from_slice(body.as_bytes());
    r
}

fn reply_head(status: &str, content_type: &str, extra: &str, len: usize) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len}\r\n{extra}Connection: close\r\n\r\n"
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(head: Option<&str>) -> String {
        let r = respond(head.map(str::as_bytes), &Metrics::new());
        let text = String::from_utf8(r).unwrap();
        text.lines().next().unwrap().to_owned()
    }

    #[test]
    fn requests_get_the_metrics_or_a_clear_status() {
        let ok = respond(Some(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n"), &Metrics::new());
        let ok = String::from_utf8(ok).unwrap();
        let (head, body) = ok.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200 OK") && head.contains(CONTENT_TYPE), "{head}");
        assert!(head.contains(&format!("Content-Length: {}", body.len())), "{head}");
        assert!(body.contains("# TYPE rudra_staleness histogram"), "{body}");
        let head_only = respond(Some(b"HEAD /metrics HTTP/1.1\r\n\r\n"), &Metrics::new());
        assert!(String::from_utf8(head_only).unwrap().ends_with("\r\n\r\n"));
        assert_eq!(status(Some("GET / HTTP/1.1\r\n\r\n")), "HTTP/1.1 404 Not Found");
        assert_eq!(status(Some("POST /metrics HTTP/1.1\r\n\r\n")), "HTTP/1.1 405 Method Not Allowed");
        assert_eq!(status(Some("garbage\r\n\r\n")), "HTTP/1.1 400 Bad Request");
        assert_eq!(status(Some("GET /metrics SPDY/3\r\n\r\n")), "HTTP/1.1 505 HTTP Version Not Supported");
        assert_eq!(status(Some("")), "HTTP/1.1 400 Bad Request");
        assert_eq!(status(None), "HTTP/1.1 431 Request Header Fields Too Large");
    }
}
