//! `rudra-node` as users run it: a short real MNIST run, its run directory, and clear
//! failures with exit code 2 for bad configuration.

use std::path::Path;
use std::process::{Command, Output};

fn node(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rudra-node"))
        .args(args)
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .output()
        .expect("rudra-node runs")
}

fn summary(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap()
}

#[test]
fn a_short_local_run_learns_mnist_and_writes_its_run_directory() {
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("run");
    let args = ["local", "--set", "training.train_examples=16000", "--set", "training.epochs=2", "--out"];
    let o = node(&[&args[..], &[dir.to_str().unwrap()]].concat(), &[]);
    assert!(o.status.success(), "stderr: {}", String::from_utf8_lossy(&o.stderr));
    let s = summary(&dir);
    for key in [
        "protocol",
        "n",
        "learners",
        "shards",
        "batch_size",
        "lr_modulation",
        "updates",
        "gradients_applied",
        "gradients_dropped",
        "samples",
        "wall_seconds",
        "samples_per_second",
        "final_test_accuracy",
        "final_train_loss",
    ] {
        assert!(s.get(key).is_some(), "summary.json lacks {key}");
    }
    for key in ["mean", "max", "histogram"] {
        assert!(s["staleness"].get(key).is_some(), "summary.json lacks staleness.{key}");
    }
    assert_eq!(s["protocol"], "softsync");
    assert_eq!(s["lr_modulation"], "per-gradient");
    let acc = s["final_test_accuracy"].as_f64().unwrap();
    assert!(acc >= 0.90, "test accuracy {acc} after a short run");
    // 16000 examples over 4 learners, μ = 32: 125 steps per epoch, 250 per learner. 4-softsync
    // with λ = 4 is async (c = 1): every gradient is an update, 1000 per shard.
    assert_eq!(s["updates"], 1000);
    assert_eq!(s["samples"], 32000);
    let applied = s["gradients_applied"].as_u64().unwrap();
    assert_eq!(applied + s["gradients_dropped"].as_u64().unwrap(), 2000, "2 shards × 1000 gradients");
    let hist: Vec<u64> =
        s["staleness"]["histogram"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(hist.iter().sum::<u64>(), applied);

    let csv = std::fs::read_to_string(dir.join("metrics.csv")).unwrap();
    let mut lines = csv.lines();
    let header = lines.next().unwrap();
    assert!(header.starts_with("wall_seconds,epoch,updates,samples,train_loss"));
    assert!(
        header.contains(",goodput,samples_learner_0,samples_learner_1,samples_learner_2,samples_learner_3,")
    );
    assert!(header.ends_with(",wait_seconds_learner_2,wait_seconds_learner_3"));
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 2, "one evaluation per epoch");
    // Each learner took 250 steps of 32 examples, computing for some of its time.
    let column = |name: &str| header.split(',').position(|h| h == name).unwrap();
    let last: Vec<&str> = rows[1].split(',').collect();
    for l in 0..4 {
        assert_eq!(last[column(&format!("samples_learner_{l}"))], "8000");
        let seconds: f64 = last[column(&format!("compute_seconds_learner_{l}"))].parse().unwrap();
        assert!(seconds > 0.0, "learner {l} computed");
    }
    let goodput: f64 = last[column("goodput")].parse().unwrap();
    assert!(goodput > 0.0 && goodput <= 1.0, "goodput {goodput}");
    let config: toml::Table =
        toml::from_str(&std::fs::read_to_string(dir.join("config.toml")).unwrap()).unwrap();
    assert_eq!(config["training"]["train_examples"].as_integer(), Some(16000));
}

#[test]
fn bad_configuration_exits_2_naming_the_key() {
    for (set, key) in [
        ("protocol.kind=paxos", "protocol.kind"),
        ("protocol.n=9", "protocol.n"),
        ("cluster.learners=0", "cluster.learners"),
        ("training.batch_size=0", "training.batch_size"),
        ("training.data_dir=/nonexistent", "training.data_dir"),
        ("compute.device=tpu", "compute.device"),
        ("training.nonsense=1", "nonsense"),
    ] {
        let o = node(&["local", "--set", set], &[]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{set}: {err}");
        assert!(err.contains(key), "{set}: the error does not name {key}: {err}");
    }
    let o = node(&["local", "--config", "/no/such/file.toml"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/no/such/file.toml"));
}

#[test]
fn environment_overrides_defaults_and_set_overrides_the_environment() {
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("run");
    let o = node(
        &[
            "local",
            "--set",
            "training.epochs=1",
            "--set",
            "cluster.shards=1",
            "--set",
            "training.train_examples=2000",
            "--set",
            "training.test_examples=500",
            "--out",
            dir.to_str().unwrap(),
        ],
        &[("RUDRA__CLUSTER__LEARNERS", "2"), ("RUDRA__CLUSTER__SHARDS", "3"), ("RUDRA__PROTOCOL__N", "2")],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = summary(&dir);
    assert_eq!(s["learners"], 2, "from the environment");
    assert_eq!(s["n"], 2, "from the environment");
    assert_eq!(s["shards"], 1, "--set beats the environment");
}

#[test]
fn logs_are_text_or_json_lines_filtered_by_rust_log() {
    let out = tempfile::tempdir().unwrap();
    let run = |format: &str, filter: &str| {
        let dir = out.path().join(format!("{format}-{filter}"));
        let args = [
            "--log-format",
            format,
            "local",
            "--set",
            "training.train_examples=2000",
            "--set",
            "training.test_examples=500",
            "--set",
            "training.epochs=1",
            "--out",
            dir.to_str().unwrap(),
        ];
        let o = node(&args, &[("RUST_LOG", filter)]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stderr).unwrap()
    };

    let json = run("json", "info");
    let lines: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    let evaluated =
        lines.iter().find(|l| l["fields"]["message"] == "evaluated").expect("an evaluation is logged");
    assert_eq!(evaluated["level"], "INFO");
    assert_eq!(evaluated["target"], "rudra_actors::scheduler");
    // A field with a number in it; how far 60 updates get depends on the machine's load, and
    // learning is a_short_local_run_learns_mnist_and_writes_its_run_directory's to check.
    let accuracy: f64 = evaluated["fields"]["test_accuracy"].as_str().unwrap().parse().unwrap();
    assert!((0.0..=1.0).contains(&accuracy), "test accuracy {accuracy}");
    assert!(
        lines.iter().any(
            |l| l["fields"]["message"] == "run directory" && l["target"] == "rudra_node::commands::local"
        )
    );

    let text = run("text", "info");
    assert!(text.contains(" INFO ") && text.contains("evaluated"), "{text}");
    assert!(!text.contains('\x1b'), "no colours when stderr is not a terminal: {text:?}");

    assert_eq!(run("text", "warn"), "", "RUST_LOG=warn keeps info lines out");
    let scheduler_only = run("text", "rudra_actors=info");
    assert!(
        scheduler_only.contains("evaluated") && !scheduler_only.contains("run directory"),
        "{scheduler_only}"
    );

    let refused = run("text", "rudra=bogus");
    assert!(refused.contains("RUST_LOG=\"rudra=bogus\" is not a valid filter"), "{refused}");
}

#[test]
fn a_run_whose_plots_cannot_be_drawn_warns_and_succeeds() {
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("run");
    // A fontconfig without fonts: plot text cannot be drawn.
    let fonts = out.path().join("fonts.conf");
    std::fs::write(&fonts, "<?xml version=\"1.0\"?>\n<fontconfig></fontconfig>\n").unwrap();
    let args = ["local", "--set", "training.train_examples=2000", "--set", "training.epochs=1", "--out"];
    let o = node(
        &[&args[..], &[dir.to_str().unwrap()]].concat(),
        &[("FONTCONFIG_FILE", fonts.to_str().unwrap())],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("WARN") && err.contains("plots were not drawn") && err.contains("font"), "{err}");
    assert!(dir.join("summary.json").is_file() && dir.join("checkpoint.safetensors").is_file());
    let pngs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .filter(|n| n.to_string_lossy().ends_with(".png"))
        .collect();
    assert!(pngs.is_empty(), "no half-drawn plots: {pngs:?}");
}

/// A node configured the way container engines do it: every flag from a `RUDRA_*` variable,
/// its name from an Indexed Job's index or a StatefulSet pod's host name.
#[test]
fn node_flags_come_from_the_environment_and_names_from_ordinals() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().to_str().unwrap();
    let stderr = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();
    // A role from the environment does not stop a subcommand in the same container.
    let o = node(&["cert", "init", "--dir", certs], &[("RUDRA_ROLE", "learner")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let base = [("RUDRA_CERTS", certs), ("RUDRA_SCHEDULER", "scheduler.invalid:7070"), ("HOSTNAME", "")];
    for (env, expected) in [
        (vec![("RUDRA_ROLE", "learner"), ("JOB_COMPLETION_INDEX", "7")], "learner-7.pem"),
        (vec![("RUDRA_ROLE", "shard"), ("HOSTNAME", "shard-3")], "shard-3.pem"),
        (vec![("RUDRA_ROLE", "shard"), ("RUDRA_NAME", "shard-5"), ("HOSTNAME", "shard-3")], "shard-5.pem"),
        (vec![("RUDRA_ROLE", "learner")], "learner-0.pem"),
    ] {
        let o = node(&[], &[&base[..], &env].concat());
        assert_eq!(o.status.code(), Some(2), "{env:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(expected) && stderr(&o).contains("--token"), "{env:?}: {}", stderr(&o));
    }
    let o = node(&[], &[("RUDRA_ROLE", "learner"), ("RUDRA_RESUME", "checkpoints")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--resume") && stderr(&o).contains("only a shard"), "{}", stderr(&o));
    let o = node(&[], &[("RUDRA_ROLE", "planner")]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // A DNS name that never resolves is retried until --connect-timeout, then the node gives up.
    let o = node(
        &[],
        &[
            ("RUDRA_ROLE", "learner"),
            ("RUDRA_TOKEN", "rudra1.learner.1.1.0000000000000000.00000000000000000000000000000000"),
            ("RUDRA_CA", &format!("{certs}/ca.pem")),
            ("RUDRA_SCHEDULER", "scheduler.invalid:7070"),
            ("RUDRA_CONNECT_TIMEOUT", "1s"),
        ],
    );
    assert_eq!(o.status.code(), Some(1), "worth a restart: {}", stderr(&o));
    assert!(
        stderr(&o).contains("gave up reaching the scheduler at scheduler.invalid:7070"),
        "{}",
        stderr(&o)
    );
}
