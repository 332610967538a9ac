//! `rudra-node study`: a tiny study of each kind (real runs in this process, and simulated
//! ones), its files, its table and figure, `--resume`, and a bad study file.

use std::path::Path;
use std::process::Command;

/// Write `toml` as a study file in `dir`.
fn study_file(dir: &Path, toml: &str) -> std::path::PathBuf {
    let path = dir.join("study.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

fn rudra_node(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rudra-node")).args(args).output().expect("rudra-node runs")
}

/// 2 axes × 2 values of short MNIST runs in this process.
fn local_study(data: &str) -> String {
    format!(
        "[cluster]\nlearners = 2\nshards = 1\n[protocol]\nn = 1\n[training]\ndata_dir = \"{data}\"\ntrain_examples = 2000\n\
         test_examples = 500\nepochs = 1\n[study]\nruns = \"local\"\n\
         figures = [\"test_error\", \"time_to_target\", \"curves\", \"staleness\"]\n\
         [[study.axis]]\nkey = \"protocol.kind\"\nvalues = [\"hardsync\", \"async\"]\n\
         [[study.axis]]\nkeys = [\"cluster.learners\", \"training.batch_size\"]\nvalues = [[1, 64], [2, 32]]\n"
    )
}

fn is_png(path: &Path) -> bool {
    std::fs::read(path).is_ok_and(|b| b.starts_with(b"\x89PNG\r\n\x1a\n") && b.len() > 1000)
}

#[test]
fn a_local_study_writes_its_points_table_and_figure_and_resumes_to_the_same_table() {
    let dir = tempfile::tempdir().unwrap();
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist");
    let file = study_file(dir.path(), &local_study(&data.display().to_string()));
    let out = dir.path().join("out");
    let (file, out_s) = (file.to_str().unwrap(), out.to_str().unwrap());
    let o = rudra_node(&["study", file, "--out", out_s]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let csv = std::fs::read_to_string(out.join("study.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert!(
        lines[0]
            .starts_with("point,protocol.kind,cluster.learners,training.batch_size,test_accuracy,test_error")
    );
    assert_eq!(lines.len(), 5, "{csv}");
    assert!(lines[1].starts_with("0,hardsync,1,64,") && lines[4].starts_with("3,async,2,32,"), "{csv}");
    for line in &lines[1..] {
        let accuracy: f64 = line.split(',').nth(4).unwrap().parse().unwrap();
        assert!(accuracy > 0.5, "every point learned: {line}");
    }
    let md = std::fs::read_to_string(out.join("study.md")).unwrap();
    assert!(
        md.contains("| point | protocol.kind | cluster.learners |") && md.matches("| async |").count() == 2
    );
    for figure in
        ["test_error", "time_to_target", "accuracy_loss_vs_time", "accuracy_loss_vs_updates", "staleness"]
    {
        assert!(is_png(&out.join(format!("{figure}.png"))), "{figure}: a PNG figure");
    }
    assert!(out.join("point-002/summary.json").is_file() && out.join("point-002/point.json").is_file());
    // A study killed during its third point: that point is incomplete, the first two are kept.
    std::fs::remove_file(out.join("point-002/point.json")).unwrap();
    std::fs::remove_file(out.join("point-003/point.json")).unwrap();
    let kept = std::fs::read_to_string(out.join("point-000/summary.json")).unwrap();
    let o = rudra_node(&["study", file, "--out", out_s, "--resume"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read_to_string(out.join("point-000/summary.json")).unwrap(), kept, "not run again");
    let again = std::fs::read_to_string(out.join("study.csv")).unwrap();
    let settings = |csv: &str| -> Vec<String> {
        csv.lines().map(|l| l.split(',').take(4).collect::<Vec<_>>().join(",")).collect()
    };
    assert_eq!(settings(&again), settings(&csv));
    assert_eq!(
        again.lines().take(3).collect::<Vec<_>>(),
        csv.lines().take(3).collect::<Vec<_>>(),
        "kept rows"
    );
}

#[test]
fn a_simulated_study_runs_each_point_per_seed_and_is_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let file = study_file(
        dir.path(),
        "[simulation]\nstop_gradients = 2000\n[study]\nruns = \"simulate\"\nseeds = [1, 2]\n\
         figures = [\"mean_staleness\", \"staleness\"]\n\
         [[study.axis]]\nkey = \"protocol.kind\"\nvalues = [\"hardsync\", \"async\"]\n\
         [[study.axis]]\nkey = \"cluster.learners\"\nvalues = [4, 8]\n",
    );
    let run = |out: &str| {
        let out = dir.path().join(out);
        let o = rudra_node(&["study", file.to_str().unwrap(), "--out", out.to_str().unwrap()]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::read_to_string(out.join("study.csv")).unwrap()
    };
    let csv = run("a");
    for figure in ["mean_staleness", "staleness"] {
        assert!(is_png(&dir.path().join(format!("a/{figure}.png"))), "{figure}: a PNG figure");
    }
    assert_eq!(csv.lines().count(), 1 + 8, "2 × 2 points × 2 seeds: {csv}");
    assert!(csv.lines().nth(2).unwrap().starts_with("1,hardsync,4,2,"), "{csv}");
    let sigma = |line: &str| -> f64 { line.split(',').nth(8).unwrap().parse().unwrap() };
    assert!(csv.lines().skip(1).take(4).all(|l| sigma(l) == 0.0), "hardsync: σ ≡ 0\n{csv}");
    assert!(csv.lines().skip(5).all(|l| sigma(l) > 1.0), "async: ⟨σ⟩ ≈ λ\n{csv}");
    // Every column but samples/s (wall-clock) is the same when the study runs again.
    let virtual_only = |csv: &str| -> Vec<String> {
        let cells = |l: &str| -> Vec<String> {
            l.split(',').enumerate().filter(|&(i, _)| i != 10).map(|(_, c)| c.to_owned()).collect()
        };
        csv.lines().map(|l| cells(l).join(",")).collect()
    };
    assert_eq!(virtual_only(&run("b")), virtual_only(&csv), "the same study gives the same table");
}

/// Every shipped study loads, and so does each of its points: a study file never fails on
/// its twentieth point.
#[test]
fn every_shipped_study_and_each_of_its_points_load() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/studies");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.retain(|p| p.extension().is_some_and(|e| e == "toml"));
    assert_eq!(files.len(), 14);
    for file in files {
        let base = rudra_runtime::Config::load(Some(&file), &[]).unwrap();
        let points = base.study.points();
        assert!(points.len() >= 6, "{}", file.display());
        for sets in points {
            let config = rudra_runtime::Config::load(Some(&file), &sets).unwrap();
            let params = config.model.layout().len;
            config
                .cluster
                .validate_settings(params)
                .unwrap_or_else(|e| panic!("{}: {sets:?}: {e}", file.display()));
        }
    }
}

#[test]
fn a_bad_study_file_exits_2_naming_the_key_before_any_point_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    for (toml, key) in [
        ("[study]\nruns = \"remote\"\n[[study.axis]]\nkey = \"protocol.n\"\nvalues = [1]\n", "study.runs"),
        ("[study]\nruns = \"local\"\n", "study.axis"),
        (
            "[study]\nfigures = [\"error_bars\"]\n[[study.axis]]\nkey = \"protocol.n\"\nvalues = [1]\n",
            "study.figures",
        ),
        (
            "[study]\nruns = \"simulate\"\nfigures = [\"curves\"]\n[[study.axis]]\nkey = \"protocol.n\"\nvalues = [1]\n",
            "study.figures",
        ),
        ("[[study.axis]]\nkey = \"protocol.kind\"\nvalues = [\"hardsync\", \"bogus\"]\n", "protocol.kind"),
        ("[[study.axis]]\nkeys = [\"protocol.kind\", \"protocol.n\"]\nvalues = [\"async\"]\n", "study.axis"),
    ] {
        let file = study_file(dir.path(), toml);
        let o = rudra_node(&["study", file.to_str().unwrap(), "--out", out.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{toml}: {stderr}");
        assert!(stderr.contains(key), "{toml}: {stderr}");
        assert!(!out.join("point-000").exists(), "no point ran: {toml}");
    }
}

/// Points are counted from the file and refused above the limit, duplicate and `study.*` axis
/// keys are refused, each with exit 2 and at once, before anything is built.
#[test]
fn an_oversized_or_ambiguous_study_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let values = |n: usize| (0..n).map(|i| (i % 8 + 1).to_string()).collect::<Vec<_>>().join(", ");
    let axis = |key: &str, n: usize| format!("[[study.axis]]\nkey = \"{key}\"\nvalues = [{}]\n", values(n));
    let huge = ["protocol.n", "cluster.learners", "training.batch_size"].map(|k| axis(k, 1_000)).concat();
    for (toml, why) in [
        (axis("protocol.n", 10_000), "10000 points"),
        (huge, "1000000000 points"),
        (format!("{}{}", axis("protocol.n", 2), axis("protocol.n", 3)), "two axes vary protocol.n"),
        (axis("study.runs", 2), "cannot vary study.runs"),
    ] {
        let file = study_file(dir.path(), &toml);
        let started = std::time::Instant::now();
        let o =
            rudra_node(&["study", file.to_str().unwrap(), "--out", dir.path().join("out").to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{why}: {stderr}");
        assert!(stderr.contains(why), "{why}: {stderr}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "{why}: took {:?}", started.elapsed());
        assert!(!dir.path().join("out").exists(), "{why}: nothing written");
    }
}
