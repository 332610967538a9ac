//! Run a Rudra cluster inside your own actix-web service, which serves the run's live metrics
//! and its status:
//!
//!     cargo run --release --example web_service [-- ADDR]
//!
//! ADDR defaults to 127.0.0.1:8080. While two learners train softmax regression on 6,000 MNIST
//! images, and afterwards until Ctrl-C:
//!
//!     curl http://127.0.0.1:8080/metrics   # Prometheus text format
//!     curl http://127.0.0.1:8080/status    # progress, then the final test accuracy

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use actix_web::{App, HttpResponse, HttpServer, web};
use rudra::actors::metrics::Metrics;
use rudra::actors::{
    BatchSizing, Cluster, ClusterSpec, Models, ProtocolSpec, RunEvent, SgdSpec, TrainingData,
};
use rudra::compute::{CpuBackend, Device, ModelSpec};
use rudra::proto::{LrModulation, LrSchedule, SyncRule};
use rudra::transport::Codecs;

/// What the HTTP handlers reach.
struct Service {
    metrics: Arc<Metrics>,
    status: Mutex<String>,
}

async fn serve_metrics(service: web::Data<Service>) -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain; version=0.0.4; charset=utf-8").body(service.metrics.render())
}

async fn serve_status(service: web::Data<Service>) -> HttpResponse {
    let status = service.status.lock().map(|s| s.clone()).unwrap_or_default();
    HttpResponse::Ok().body(status + "\n")
}

#[actix_web::main]
async fn main() -> anyhow::Result<()> {
    let addr: SocketAddr = std::env::args().nth(1).as_deref().unwrap_or("127.0.0.1:8080").parse()?;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist");
    let (train, test) = rudra::compute::data::load_mnist(&dir)?;
    let data = TrainingData { train: Arc::new(train.head(6000)), test: Arc::new(test.head(2000)) };
    let spec = ClusterSpec {
        learners: 2,
        shards: 1,
        protocol: ProtocolSpec::Sgd(SgdSpec {
            rule: SyncRule::Softsync { n: 2 },
            modulation: LrModulation::None,
            max_staleness: None,
            backups: 0,
            prefetch: 0,
            quorum: None,
        }),
        batch_size: 32,
        epochs: 3,
        schedule: LrSchedule { base: 0.2, decay: 0.9 },
        seed: 1,
        evals_per_epoch: 1,
        codecs: Codecs::default(),
        batch_sizing: BatchSizing::Fixed,
        groups: 1,
        hierarchical: false,
        group_n: 1,
    };
    let models = Models::builtin(&ModelSpec::dense(784, vec![], 10), spec.seed, Device::Cpu(CpuBackend));
    let metrics = Arc::new(Metrics::new());
    let service =
        web::Data::new(Service { metrics: Arc::clone(&metrics), status: Mutex::new("starting".into()) });

    // The cluster's actors run on threads of their own, so the web service stays responsive.
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let cluster = Cluster::new(spec, models, data)?.with_metrics(metrics).observe(tx).start()?;
    let status = service.clone();
    let set = move |text: String| {
        if let Ok(mut s) = status.status.lock() {
            *s = text;
        }
    };
    actix_web::rt::spawn(async move {
        while let Some(event) = events.recv().await {
            match event {
                RunEvent::Progress(p) => {
                    set(format!("training: {} of {} examples", p.samples, p.total_samples))
                }
                RunEvent::Evaluated(row) => {
                    set(format!("epoch {:.1}: test accuracy {:.4}", row.epoch, row.test_accuracy))
                }
            }
        }
        let done = match cluster.wait().await {
            Ok(report) => format!(
                "done: test accuracy {:.4} after {} updates",
                report.final_test_accuracy, report.updates
            ),
            Err(e) => format!("failed: {e}"),
        };
        println!("{done}; still serving until Ctrl-C");
        set(done);
    });

    println!("serving http://{addr}/metrics and http://{addr}/status");
    HttpServer::new(move || {
        App::new()
            .app_data(service.clone())
            .route("/metrics", web::get().to(serve_metrics))
            .route("/status", web::get().to(serve_status))
    })
    .workers(1)
    .bind(addr)?
    .run()
    .await?;
    Ok(())
}
