//! A real run's `checkpoint.safetensors` as Python reads it: the `safetensors` package and
//! numpy must see the tensor names, shapes, values and metadata that Rust wrote. Where the
//! system's Python lacks them they are installed into a virtual environment under `target/`;
//! the test never skips.

mod common;

use std::path::Path;
use std::process::Command;

use common::{python_with, short_run, summary};
use rudra_runtime::Checkpoint;
use serde_json::Value;

#[test]
fn python_reads_the_names_shapes_values_and_metadata_rust_wrote() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    short_run(&run, &["training.hidden=[24, 12]", "cluster.learners=2", "protocol.kind=async"]);
    let path = run.join("checkpoint.safetensors");

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/read_checkpoint.py");
    let python = python_with(&["safetensors", "numpy"]);
    let o = Command::new(&python).arg(&script).arg(&path).output().expect("python runs");
    assert!(o.status.success(), "{} failed:\n{}", script.display(), String::from_utf8_lossy(&o.stderr));
    let seen: Value = serde_json::from_slice(&o.stdout).unwrap();

    let written = Checkpoint::read(&path).unwrap();
    let layout = written.spec.layout();
    let names: Vec<&str> = layout.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"]);
    let tensors = seen["tensors"].as_object().unwrap();
    assert_eq!(tensors.len(), names.len(), "no other tensors: {:?}", tensors.keys());
    let shapes = [vec![24, 784], vec![24], vec![12, 24], vec![12], vec![10, 12], vec![10]];
    for (t, shape) in layout.tensors.iter().zip(shapes) {
        let py = &tensors[&t.name];
        assert_eq!(py["dtype"], "float32", "{}", t.name);
        assert_eq!(py["shape"], serde_json::json!(shape), "{}", t.name);
        let values = &written.params[t.range.clone()];
        // numpy widens each f32 exactly; narrowing the decimal back gives the same bits.
        let as_f32 = |v: &Value| v.as_f64().unwrap() as f32;
        let first: Vec<f32> = py["first"].as_array().unwrap().iter().map(as_f32).collect();
        assert_eq!(first, values[..3.min(values.len())], "{}: the same values", t.name);
        assert_eq!(as_f32(&py["last"]), values[values.len() - 1], "{}", t.name);
        let sum: f64 = values.iter().map(|&v| f64::from(v)).sum();
        let py_sum = py["sum"].as_f64().unwrap();
        assert!(
            (py_sum - sum).abs() <= 1e-9 * (1.0 + sum.abs()),
            "{}: numpy sums {py_sum}, Rust {sum}",
            t.name
        );
        assert!(values.iter().any(|&v| v != 0.0), "{} was trained", t.name);
    }

    let meta = &seen["metadata"];
    let s = summary(&run);
    for (key, value) in [
        ("model", "mlp"),
        ("inputs", "784"),
        ("hidden", "[24,12]"),
        ("classes", "10"),
        ("protocol", "async"),
        ("n", "2"),
        ("learners", "2"),
        ("batch_size", "32"),
        ("epochs", "2"),
        ("seed", "1"),
        ("dataset", "mnist"),
    ] {
        assert_eq!(meta[key], value, "metadata {key}");
    }
    assert_eq!(meta["protocol"], s["protocol"]);
    assert_eq!(meta["shards"], s["shards"].to_string());
}
