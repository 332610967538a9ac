//! `rudra-node eval` on the checkpoint of a real run, and its clear failures.

mod common;

use std::path::Path;

use common::{node, short_run, summary};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `(correct, examples)` from eval's line "… (K of N correct) …".
fn counts(stdout: &str) -> (u64, u64) {
    let inside = stdout.split('(').nth(1).and_then(|s| s.split(" correct)").next()).expect(stdout);
    let (k, n) = inside.split_once(" of ").expect(stdout);
    (k.parse().unwrap(), n.parse().unwrap())
}

#[test]
fn eval_prints_the_test_accuracy_the_run_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    short_run(&run, &["cluster.learners=2", "protocol.n=2"]);
    let checkpoint = run.join("checkpoint.safetensors");
    let config = run.join("config.toml");

    let o =
        node(&["eval", "--checkpoint", checkpoint.to_str().unwrap(), "--config", config.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let stdout = text(&o.stdout);
    assert!(stdout.starts_with("mlp 784-32-10: test accuracy "), "{stdout}");
    let (correct, examples) = counts(&stdout);
    assert_eq!(examples, 1000, "the run's own test set, from its config.toml");
    let reported = summary(&run)["final_test_accuracy"].as_f64().unwrap();
    assert_eq!(correct as f64 / examples as f64, reported, "{stdout}");
    assert!(stdout.contains(&format!("test accuracy {reported:.4} ")), "{stdout}");

    // The model comes from the checkpoint whatever the configuration says; --set picks the set.
    let o = node(&[
        "eval",
        "--checkpoint",
        checkpoint.to_str().unwrap(),
        "--set",
        "training.test_examples=300",
        "--set",
        "training.hidden=[512]",
        "--dataset",
        "mnist",
        "--data-dir",
        "data/mnist",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(counts(&text(&o.stdout)).1, 300);
}

/// A tiny MNIST-format dataset of 4×4 images in `dir`.
fn write_small_images(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for prefix in ["train", "t10k"] {
        let n: u32 = 3;
        let mut images = vec![0, 0, 8, 3];
        for d in [n, 4, 4] {
            images.extend(d.to_be_bytes());
        }
        images.extend((0..n * 16).map(|i| (i * 5) as u8));
        let mut labels = vec![0, 0, 8, 1];
        labels.extend(n.to_be_bytes());
        labels.extend([0, 1, 2]);
        std::fs::write(dir.join(format!("{prefix}-images-idx3-ubyte")), images).unwrap();
        std::fs::write(dir.join(format!("{prefix}-labels-idx1-ubyte")), labels).unwrap();
    }
}

#[test]
fn eval_explains_missing_corrupt_and_mismatched_inputs() {
    let tmp = tempfile::tempdir().unwrap();
    let fails = |args: &[&str], what: &[&str]| {
        let o = node(&[&["eval"], args].concat());
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        for w in what {
            assert!(err.contains(w), "{args:?}: the error does not mention {w}: {err}");
        }
        assert!(!err.contains("panicked"), "{err}");
    };
    let missing = tmp.path().join("missing.safetensors");
    fails(
        &["--checkpoint", missing.to_str().unwrap()],
        &["missing.safetensors", "cannot read the checkpoint"],
    );

    let corrupt = tmp.path().join("corrupt.safetensors");
    std::fs::write(&corrupt, b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\": oops}    ").unwrap();
    fails(&["--checkpoint", corrupt.to_str().unwrap()], &["corrupt.safetensors", "not a safetensors file"]);

    // A real checkpoint whose metadata claims a wider hidden layer than its tensors have.
    let run = tmp.path().join("run");
    short_run(&run, &["cluster.learners=1", "protocol.n=1", "cluster.shards=1", "training.epochs=1"]);
    let bytes = std::fs::read(run.join("checkpoint.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let mut metadata = header.metadata().clone().unwrap();
    assert_eq!(metadata["hidden"], "[32]");
    metadata.insert("hidden".into(), "[64]".into());
    let wider = tmp.path().join("wider.safetensors");
    std::fs::write(&wider, safetensors::tensor::serialize(st.tensors(), Some(metadata)).unwrap()).unwrap();
    fails(
        &["--checkpoint", wider.to_str().unwrap()],
        &["wider.safetensors", "fc1.weight", "[32, 784]", "[64, 784]"],
    );

    // A dataset whose images are not MNIST's 28×28: the file is named.
    let small = tmp.path().join("small");
    write_small_images(&small);
    let checkpoint = run.join("checkpoint.safetensors");
    fails(
        &["--checkpoint", checkpoint.to_str().unwrap(), "--data-dir", small.to_str().unwrap()],
        &["train-images-idx3-ubyte", "16 pixels", "28×28 (784)"],
    );
    fails(
        &["--checkpoint", checkpoint.to_str().unwrap(), "--dataset", "imagenet"],
        &["training.dataset", "imagenet"],
    );
}
