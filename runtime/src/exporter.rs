//! `--metrics-addr`: a node's HTTP endpoint for whoever watches it, served by actix-web:
//!
//! - `/metrics`: the node's [`Metrics`] in the Prometheus text format (encoded by
//!   `prometheus-client`);
//! - `/healthz`: 200 while the node's event loop turns (liveness), 503 once it has stalled;
//! - `/readyz`: 200 once the node has joined and serves its peers (readiness), 503 before.
//!
//! `GET` and `HEAD` are answered; other methods get 405, other paths 404. The server runs on a
//! thread of its own, so a node busy training still answers, and stops with the node.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use actix_web::http::header::ContentType;
use actix_web::{App, HttpResponse, HttpServer, web};
use rudra_actors::InvalidSetting;
use rudra_actors::metrics::{CONTENT_TYPE, Metrics};

use crate::RuntimeError;

/// How often a serving node proves its event loop turns.
const TICK: Duration = Duration::from_secs(1);
/// `/healthz` fails once the event loop has not turned for this long.
const STALLED: Duration = Duration::from_secs(15);

/// A bound endpoint, not yet serving.
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
        let addr = listener.local_addr().map_err(invalid)?;
        Ok(Self { listener, addr })
    }

    /// Bind `addr` when one is given.
    pub fn bind_if(addr: Option<SocketAddr>) -> Result<Option<Self>, RuntimeError> {
        addr.map(Self::bind).transpose()
    }

    /// Serve a fresh registry until the returned [`Serving`] is dropped. Must be called inside
    /// an actix `System`: its event loop is the one `/healthz` watches.
    pub fn start(self) -> Result<Serving, RuntimeError> {
        let metrics = Arc::new(Metrics::new());
        let health = Health::new();
        let state = web::Data::new(State { metrics: Arc::clone(&metrics), health: health.clone() });
        let server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .service(endpoint("/metrics", render_metrics))
                .service(endpoint("/healthz", healthz))
                .service(endpoint("/readyz", readyz))
                .default_service(web::to(|| async {
                    HttpResponse::NotFound().body("not found; try /metrics, /healthz or /readyz\n")
                }))
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(0)
        .listen(self.listener)
        .map_err(|e| {
            RuntimeError::Invalid(InvalidSetting::new(
                "--metrics-addr",
                format!("cannot serve on {}: {e}", self.addr),
            ))
        })?
        .run();
        let handle = server.handle();
        actix::spawn(server);
        let ticks = Arc::clone(&health.0);
        let ticker = actix::spawn(async move {
            let mut interval = tokio::time::interval(TICK);
            loop {
                interval.tick().await;
                ticks.tick();
            }
        });
        tracing::info!("serving /metrics, /healthz and /readyz at http://{}", self.addr);
        Ok(Serving { metrics, health, handle, ticker })
    }
}

/// A resource answering `GET` and `HEAD` with `handler`, 405 otherwise.
fn endpoint<F, R>(path: &str, handler: F) -> actix_web::Resource
where
    F: actix_web::Handler<(web::Data<State>,), Output = R> + Clone + 'static,
    R: actix_web::Responder + 'static,
{
    web::resource(path).route(web::get().to(handler.clone())).route(web::head().to(handler)).default_service(
        web::to(|| async {
            HttpResponse::MethodNotAllowed()
                .insert_header(("Allow", "GET, HEAD"))
                .body("only GET and HEAD are served\n")
        }),
    )
}

struct State {
    metrics: Arc<Metrics>,
    health: Health,
}

async fn render_metrics(state: web::Data<State>) -> HttpResponse {
    HttpResponse::Ok().content_type(CONTENT_TYPE).body(state.metrics.render())
}

async fn healthz(state: web::Data<State>) -> HttpResponse {
    let since = state.health.0.since_tick();
    if since < STALLED {
        HttpResponse::Ok().content_type(ContentType::plaintext()).body("alive\n")
    } else {
        HttpResponse::ServiceUnavailable()
            .content_type(ContentType::plaintext())
            .body(format!("the node's event loop has not turned for {since:.0?}\n"))
    }
}

async fn readyz(state: web::Data<State>) -> HttpResponse {
    if state.health.is_ready() {
        HttpResponse::Ok().content_type(ContentType::plaintext()).body("ready\n")
    } else {
        HttpResponse::ServiceUnavailable()
            .content_type(ContentType::plaintext())
            .body("not ready: the node has not joined its cluster yet\n")
    }
}

/// What `/healthz` and `/readyz` report.
#[derive(Clone, Debug)]
struct Health(Arc<HealthState>);

#[derive(Debug)]
struct HealthState {
    ready: AtomicBool,
    /// Milliseconds after `born` of the event loop's last tick.
    last_tick_ms: AtomicU64,
    born: Instant,
}

impl HealthState {
    fn tick(&self) {
        self.last_tick_ms.store(self.born.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    fn since_tick(&self) -> Duration {
        self.born.elapsed().saturating_sub(Duration::from_millis(self.last_tick_ms.load(Ordering::Relaxed)))
    }
}

impl Health {
    fn new() -> Self {
        Self(Arc::new(HealthState {
            ready: AtomicBool::new(false),
            last_tick_ms: AtomicU64::new(0),
            born: Instant::now(),
        }))
    }

    fn is_ready(&self) -> bool {
        self.0.ready.load(Ordering::Relaxed)
    }
}

/// A serving endpoint: the registry the node records into, and its readiness. Dropping it
/// stops the server.
#[derive(Debug)]
pub struct Serving {
    metrics: Arc<Metrics>,
    health: Health,
    handle: actix_web::dev::ServerHandle,
    ticker: tokio::task::JoinHandle<()>,
}

impl Serving {
    /// The registry this endpoint serves.
    #[must_use]
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Say on `/readyz` whether the node has joined and serves its peers.
    pub fn set_ready(&self, ready: bool) {
        self.health.0.ready.store(ready, Ordering::Relaxed);
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        // The stop command is sent at once; nothing needs to wait for it to complete.
        drop(self.handle.stop(false));
        self.ticker.abort();
    }
}
