//! Bad configuration and bad data through `rudra-node`, as a careless or hostile user gives
//! them: every one exits 2 with a message naming the key or the file, nothing panics, and
//! nothing is quietly rounded, saturated or replaced.

mod common;

use std::path::Path;

use common::node;

/// Run `local` with `args`; it must fail with exit code 2 and a message holding `expect`.
fn refused(args: &[&str], expect: &str) {
    let out = tempfile::tempdir().unwrap();
    let mut all = vec!["local", "--out", out.path().to_str().unwrap()];
    all.extend(args);
    let o = node(&all);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{args:?}: exit {:?}: {err}", o.status.code());
    assert!(err.contains(expect), "{args:?}: the message does not name {expect:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
}

#[test]
fn every_bad_setting_exits_2_naming_its_key() {
    let cases: &[(&str, &str)] = &[
        // Sizes that would overflow or exhaust memory.
        ("training.hidden=[1e300]", "training.hidden"),
        ("training.hidden=[100000000]", "training.hidden"),
        ("training.batch_size=100000000", "training.batch_size"),
        // Fractions, NaN and huge values for integer keys: never rounded or saturated.
        ("cluster.learners=4.5", "cluster.learners"),
        ("cluster.learners=5000000000", "cluster.learners"),
        ("protocol.max_staleness=1.7", "protocol.max_staleness"),
        ("checkpoint.every_updates=nan", "checkpoint.every_updates"),
        ("cluster.failure_timeout_ms=1e300", "cluster.failure_timeout_ms"),
        ("protocol.tau=1e300", "protocol.tau"),
        // Empty paths.
        ("checkpoint.dir=", "checkpoint.dir"),
        ("training.data_dir=", "training.data_dir"),
        // Keys of other protocols are checked under softsync too.
        ("protocol.momentum=1.5", "protocol.momentum"),
        ("protocol.alpha=-0.5", "protocol.alpha"),
        ("protocol.beta=inf", "protocol.beta"),
        ("protocol.tau=0", "protocol.tau"),
        ("training.lr_decay_gamma=-1", "training.lr_decay_gamma"),
        ("training.learning_rate=nan", "training.learning_rate"),
    ];
    for (set, key) in cases {
        refused(&["--set", set], key);
    }
    let e = node(&["local", "--set", "protocol.tau=1e300"]);
    assert!(String::from_utf8_lossy(&e.stderr).contains("1e300"), "a huge number is written briefly");
}

#[test]
fn bad_configuration_files_are_named_with_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let overflow = dir.path().join("overflow.toml");
    std::fs::write(&overflow, "[training]\nepochs = 1e400\n").unwrap();
    refused(&["--config", overflow.to_str().unwrap()], "(key `training.epochs`)");
    refused(&["--config", dir.path().to_str().unwrap()], "is a directory");
    refused(&["--config", "/dev/null"], "/dev/null: is not a regular file");
    refused(&["--config", "/dev/zero"], "/dev/zero: is not a regular file");
    refused(&["--config", "/no/such.toml"], "/no/such.toml: cannot be read");
}

/// An IDX file of unsigned bytes with dimensions `dims`, every element `value`.
fn idx(path: &Path, dims: &[u32], value: u8) {
    let mut bytes = vec![0, 0, 8, dims.len() as u8];
    for d in dims {
        bytes.extend(d.to_be_bytes());
    }
    bytes.extend(std::iter::repeat_n(value, dims.iter().map(|&d| d as usize).product()));
    std::fs::write(path, bytes).unwrap();
}

/// A dataset directory of MNIST's layout, 8 training and 4 test images of 28×28.
fn mnist_like(dir: &Path) {
    idx(&dir.join("train-images-idx3-ubyte"), &[8, 28, 28], 100);
    idx(&dir.join("train-labels-idx1-ubyte"), &[8], 3);
    idx(&dir.join("t10k-images-idx3-ubyte"), &[4, 28, 28], 100);
    idx(&dir.join("t10k-labels-idx1-ubyte"), &[4], 3);
}

#[test]
fn bad_dataset_files_are_named_and_never_block() {
    let set = |dir: &Path| format!("training.data_dir={}", dir.display());
    let small =
        ["--set", "cluster.learners=2", "--set", "protocol.kind=async", "--set", "training.batch_size=2"];
    let run = |dir: &Path, expect: &str| {
        let data = set(dir);
        let mut args = vec!["--set", data.as_str()];
        args.extend(small);
        refused(&args, expect);
    };

    // A FIFO where a file should be: refused at once, never waited on.
    let fifo = tempfile::tempdir().unwrap();
    mnist_like(fifo.path());
    let path = fifo.path().join("train-images-idx3-ubyte");
    std::fs::remove_file(&path).unwrap();
    assert!(std::process::Command::new("mkfifo").arg(&path).status().unwrap().success());
    run(fifo.path(), "train-images-idx3-ubyte is invalid: is not a regular file");

    // No images at all.
    let empty = tempfile::tempdir().unwrap();
    mnist_like(empty.path());
    idx(&empty.path().join("train-images-idx3-ubyte"), &[0, 28, 28], 0);
    idx(&empty.path().join("train-labels-idx1-ubyte"), &[0], 0);
    run(empty.path(), "train-images-idx3-ubyte is invalid: holds no images");

    // No test images: named as the test set, not blamed on a setting.
    let no_test = tempfile::tempdir().unwrap();
    mnist_like(no_test.path());
    idx(&no_test.path().join("t10k-images-idx3-ubyte"), &[0, 28, 28], 0);
    idx(&no_test.path().join("t10k-labels-idx1-ubyte"), &[0], 0);
    run(no_test.path(), "t10k-images-idx3-ubyte is invalid: holds no images");

    // Test images of another size.
    let odd = tempfile::tempdir().unwrap();
    mnist_like(odd.path());
    idx(&odd.path().join("t10k-images-idx3-ubyte"), &[4, 27, 29], 100);
    run(odd.path(), "t10k-images-idx3-ubyte is invalid: images of 783 pixels");
}

/// Every permanent error of the command line exits 2 with its reason, so that an engine does
/// not restart what cannot succeed (a lost peer, worth a retry, exits 1): misused join tokens,
/// a finished run given to `--resume`, a damaged checkpoint, text that is no join token.
#[test]
fn every_permanent_error_exits_2_with_its_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let path = |p: &str| tmp.path().join(p).to_str().unwrap().to_owned();
    let (ca, ca_pem, node_certs) = (path("ca"), path("ca/ca.pem"), path("node"));
    let (finished, damaged) = (path("finished"), path("damaged.safetensors"));
    assert!(node(&["cert", "init", "--dir", &ca]).status.success());
    std::fs::write(&damaged, b"not a checkpoint").unwrap();
    std::fs::create_dir(&finished).unwrap();
    std::fs::write(path("finished/summary.json"), "{}").unwrap();
    let long = format!("rudra1.learner.{}", "0".repeat(20_000));
    let no_ca = path("no-such-ca");
    let learner = ["--role", "learner", "--scheduler", "127.0.0.1:9", "--certs", &node_certs];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["cert", "token", "--dir", &ca, "--role", "scheduler"], "enrols no one"),
        (vec!["cert", "token", "--dir", &ca, "--role", "learner", "--uses", "0"], "at least one use"),
        (vec!["cert", "token", "--dir", &no_ca, "--role", "learner"], "cert init"),
        (
            vec!["--role", "scheduler", "--certs", &ca, "--listen", "127.0.0.1:0", "--resume", &finished],
            "nothing to take back",
        ),
        (vec!["eval", "--checkpoint", &damaged], "damaged.safetensors"),
        ([&learner[..], &["--ca", &ca_pem]].concat(), "--token"),
        ([&learner[..], &["--token", &long]].concat(), "at most 256"),
    ];
    for (args, expect) in cases {
        let o = node(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: exit {:?}: {err}", o.status.code());
        assert!(err.contains(expect), "{args:?}: the message does not say {expect:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
