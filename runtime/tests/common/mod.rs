//! What the tests that drive `rudra-node` share: running it, and short real runs.

use std::path::Path;
use std::process::{Command, Output};

/// Run `rudra-node args` from the repository root (warnings and errors logged only).
pub fn node(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rudra-node"))
        .args(args)
        .env("RUST_LOG", "warn")
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .output()
        .expect("rudra-node runs")
}

/// A `local` run of 2 epochs over 4,000 MNIST training and 1,000 test examples with an MLP
/// of 32 hidden units, changed by `settings`, into `dir`.
pub fn short_run(dir: &Path, settings: &[&str]) {
    let base = [
        "training.train_examples=4000",
        "training.test_examples=1000",
        "training.epochs=2",
        "training.hidden=[32]",
    ];
    let mut args = vec!["local", "--out", dir.to_str().unwrap()];
    for s in base.iter().chain(settings) {
        args.extend(["--set", s]);
    }
    let o = node(&args);
    assert!(o.status.success(), "rudra-node {args:?}: {}", String::from_utf8_lossy(&o.stderr));
}

/// The run's `summary.json`.
pub fn summary(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap()
}
