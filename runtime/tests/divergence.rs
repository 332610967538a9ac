//! A run that diverges stops, says where and what to change, records `outcome = "diverged"` in
//! its summary and exits 3; one that trains records `outcome = "completed"` and exits 0.

mod common;

use common::{node, summary};

#[test]
fn no_diverged_run_exits_0() {
    let base = ["training.train_examples=4000", "training.test_examples=500", "training.epochs=1"];
    for (sets, hint) in [
        (
            &["protocol.kind=mdownpour", "training.learning_rate=2", "protocol.momentum=0.99"][..],
            "protocol.momentum",
        ),
        (&["training.learning_rate=1000"][..], "training.learning_rate (now 1000)"),
        (&["training.learning_rate=1e10"][..], "training.learning_rate"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut args = vec!["local", "--out", dir.path().to_str().unwrap()];
        for s in base.iter().chain(sets) {
            args.extend(["--set", s]);
        }
        let o = node(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(3), "{sets:?}: {err}");
        assert!(err.contains("the run diverged at update") && err.contains(hint), "{sets:?}: {err}");
        let s = summary(dir.path());
        assert_eq!(s["outcome"], "diverged", "{sets:?}");
        assert!(s["diverged"]["update"].as_u64().is_some(), "{sets:?}: the update is named");
    }
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["local", "--out", dir.path().to_str().unwrap()];
    for s in base {
        args.extend(["--set", s]);
    }
    assert!(node(&args).status.success());
    assert_eq!(summary(dir.path())["outcome"], "completed");
}
