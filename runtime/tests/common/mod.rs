//! What the tests that drive `rudra-node` share: running it, and short real runs.
// Each test binary uses part of it.
#![allow(dead_code)]

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
    short_run_with(dir, &[], settings);
}

/// [`short_run`] with more arguments of `rudra-node local` (`--transport quic`).
pub fn short_run_with(dir: &Path, local: &[&str], settings: &[&str]) {
    let base = [
        "training.train_examples=4000",
        "training.test_examples=1000",
        "training.epochs=2",
        "training.hidden=[32]",
    ];
    let mut args = [&["local", "--out", dir.to_str().unwrap()][..], local].concat();
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

/// A Python 3 that can import `packages`: the system's `python3` when it can, else one of a
/// virtual environment made on first use under the build directory (`target/tmp/pyenv`), with
/// the packages installed into it by pip, so the tests need nothing installed by hand.
pub fn python_with(packages: &[&str]) -> std::path::PathBuf {
    let imports = format!("import {}", packages.join(", "));
    let can_import = |python: &Path| {
        Command::new(python).args(["-c", &imports]).output().is_ok_and(|o| o.status.success())
    };
    let system = Path::new("python3");
    if can_import(system) {
        return system.to_owned();
    }
    let env = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pyenv");
    let python = env.join("bin").join("python");
    let ready = env.join("ready");
    if !(ready.exists() && can_import(&python)) {
        let _ = std::fs::remove_dir_all(&env);
        let run = |cmd: &mut Command| {
            let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?} cannot start ({e}); install Python 3"));
            assert!(o.status.success(), "{cmd:?} failed:\n{}", String::from_utf8_lossy(&o.stderr));
        };
        run(Command::new("python3").args(["-m", "venv"]).arg(&env));
        run(Command::new(&python).args(["-m", "pip", "install", "--quiet"]).args(packages));
        std::fs::write(&ready, imports).expect("the environment's marker is written");
    }
    python
}

/// The tensors of the safetensors file at `path`, by name.
pub fn tensors(path: &Path) -> Vec<(String, Vec<f32>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<(String, Vec<f32>)> = st
        .tensors()
        .into_iter()
        .map(|(name, t)| {
            (name, t.data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect())
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}
