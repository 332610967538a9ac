//! Embed a Rudra parameter shard and a learner in your own actix-web service, which also
//! serves the shard's live metrics and weights:
//!
//!     cargo run --release --example web_service [-- ADDR]
//!
//! ADDR defaults to 127.0.0.1:8080. While the learner trains softmax regression on 6,000 MNIST
//! images, and afterwards until Ctrl-C:
//!
//!     curl http://127.0.0.1:8080/metrics   # Prometheus text format
//!     curl http://127.0.0.1:8080/weights   # the shard's clock and parameter count

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use actix::prelude::*;
use actix_web::{App, HttpResponse, HttpServer, web};
use rudra::actors::learner::{LearnerActor, ShardLink, StartLearner};
use rudra::actors::metrics::Metrics;
use rudra::actors::protocol::{LrModulation, LrSchedule, SyncRule};
use rudra::actors::shard::{ShardActor, Snapshot};
use rudra::actors::tracker::StalenessTracker;
use rudra::actors::{ClusterSpec, ProtocolSpec};
use rudra::compute::{CpuBackend, Model, ModelSpec};
use rudra::transport::ShardId;

/// What the HTTP handlers reach.
struct Service {
    metrics: Arc<Metrics>,
    shard: Addr<ShardActor>,
}

async fn serve_metrics(service: web::Data<Service>) -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain; version=0.0.4; charset=utf-8").body(service.metrics.render())
}

async fn serve_weights(service: web::Data<Service>) -> actix_web::Result<HttpResponse> {
    let w = service.shard.send(Snapshot).await.map_err(actix_web::error::ErrorServiceUnavailable)?;
    Ok(HttpResponse::Ok().body(format!("clock {} over {} parameters\n", w.clock.0, w.values.len())))
}

#[actix_web::main]
async fn main() -> anyhow::Result<()> {
    let addr: SocketAddr = std::env::args().nth(1).as_deref().unwrap_or("127.0.0.1:8080").parse()?;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist");
    let (train, _) = rudra::compute::data::load_mnist(&dir)?;
    let train = Arc::new(train.head(6000));
    // One learner and one shard: 1-softsync applies every gradient as it arrives.
    let spec = ClusterSpec {
        learners: 1,
        shards: 1,
        protocol: ProtocolSpec {
            rule: SyncRule::Softsync { n: 1 },
            modulation: LrModulation::None,
            max_staleness: None,
            elastic: None,
        },
        model: ModelSpec::dense(784, vec![], 10),
        batch_size: 32,
        epochs: 3,
        schedule: LrSchedule { base: 0.2, decay: 0.9 },
        seed: 1,
        evals_per_epoch: 1,
    };

    // The shard counts every gradient and update in the service's metrics registry.
    let metrics = Arc::new(Metrics::new());
    let tracker = StalenessTracker::default().start().recipient();
    let (core, counters) = (spec.shard_actor_core(0, train.len()), metrics.shard(ShardId(0)));
    let shard_thread = Arbiter::new();
    let shard = ShardActor::start_in_arbiter(&shard_thread.handle(), move |_| {
        ShardActor::new(core, tracker).with_metrics(Some(counters))
    });

    // The learner computes on its own thread, so the web service stays responsive.
    let (link, done) = common::Coordinator::start(1, Some(Arc::clone(&metrics)));
    let (core, batches) = spec.learner_loop(0, train);
    let range = spec.shard_ranges().swap_remove(0);
    let shards = vec![ShardLink::local(range, &shard)];
    let model = Model::new(CpuBackend, spec.model.clone())?;
    let learner_thread = Arbiter::new();
    let learner = LearnerActor::start_in_arbiter(&learner_thread.handle(), move |_| {
        LearnerActor::new(core, model, batches, shards, link)
    });
    learner.do_send(StartLearner);
    actix::spawn(async move {
        match done.await {
            Ok(Ok(samples)) => println!("trained on {samples} examples; still serving until Ctrl-C"),
            Ok(Err(e)) => eprintln!("training failed: {e}"),
            Err(_) => eprintln!("the coordinator stopped before the learner finished"),
        }
    });

    let service = web::Data::new(Service { metrics, shard });
    println!("serving http://{addr}/metrics and http://{addr}/weights");
    HttpServer::new(move || {
        App::new()
            .app_data(service.clone())
            .route("/metrics", web::get().to(serve_metrics))
            .route("/weights", web::get().to(serve_weights))
    })
    .workers(1)
    .bind(addr)?
    .run()
    .await?;
    Ok(())
}
