//! `rudra-node report` over real runs, and the plots every run directory gets.

mod common;

use std::collections::HashSet;
use std::path::Path;

use common::{node, short_run, summary};
use rudra_runtime::plot::{COMPARISON_PLOTS, RUN_PLOTS};

/// The first two line colours of the plots (plotters' `Palette99`).
const FIRST_RUN: [u8; 3] = [230, 25, 75];
const SECOND_RUN: [u8; 3] = [60, 180, 75];

/// Decode the PNG at `path`: its size and the set of colours it uses.
fn decode(path: &Path) -> ((u32, u32), HashSet<[u8; 3]>) {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut reader = png::Decoder::new(std::io::BufReader::new(file)).read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size()];
    let frame = reader.next_frame(&mut pixels).unwrap();
    let step = match frame.color_type {
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        other => panic!("{}: unexpected colour type {other:?}", path.display()),
    };
    let colours = pixels[..frame.buffer_size()].chunks_exact(step).map(|p| [p[0], p[1], p[2]]).collect();
    ((frame.width, frame.height), colours)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn report_compares_two_runs_in_a_table_and_on_shared_axes() {
    let tmp = tempfile::tempdir().unwrap();
    let (hard, asy) = (tmp.path().join("hard"), tmp.path().join("asy"));
    short_run(&hard, &["protocol.kind=hardsync", "cluster.learners=2", "cluster.shards=1"]);
    short_run(&asy, &["protocol.kind=async", "cluster.learners=2"]);

    for dir in [&hard, &asy] {
        for name in RUN_PLOTS {
            let (size, colours) = decode(&dir.join(name));
            assert_eq!(size, (960, 900), "{name}");
            assert!(colours.len() > 10, "{name} is nearly blank");
        }
        let (_, curves) = decode(&dir.join(RUN_PLOTS[0]));
        assert!(curves.contains(&FIRST_RUN) && !curves.contains(&SECOND_RUN), "one run, one line");
    }

    let out = tmp.path().join("cmp");
    let o = node(&["report", hard.to_str().unwrap(), asy.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let stdout = text(&o.stdout);
    let table: Vec<&str> = stdout.lines().filter(|l| l.starts_with('|')).collect();
    assert_eq!(table.len(), 4, "header, rule, two runs:\n{stdout}");
    assert!(table[0].contains("time to 0.97 (s)"), "the default target is 0.97");
    assert!(table[2].starts_with("| hard ") && table[2].contains("| hardsync "), "{stdout}");
    assert!(table[3].starts_with("| asy ") && table[3].contains("| async "), "{stdout}");
    assert_eq!(std::fs::read_to_string(out.join("report.md")).unwrap(), table.join("\n") + "\n");

    for name in COMPARISON_PLOTS {
        let (size, colours) = decode(&out.join(name));
        assert_eq!(size, (960, 900));
        assert!(colours.contains(&FIRST_RUN) && colours.contains(&SECOND_RUN), "{name}: a line per run");
    }

    // A target both runs reach early, and one neither reaches.
    let o = node(&[
        "report",
        hard.to_str().unwrap(),
        asy.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--target",
        "0.5",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let csv = std::fs::read_to_string(out.join("report.csv")).unwrap();
    let rows: Vec<Vec<&str>> = csv.lines().map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0][0], "run");
    for (row, dir, protocol) in [(&rows[1], &hard, "hardsync"), (&rows[2], &asy, "async")] {
        let s = summary(dir);
        assert_eq!(row[..5], [dir.file_name().unwrap().to_str().unwrap(), protocol, "2", "32", "64"]);
        let acc: f64 = row[6].parse().unwrap();
        assert!((acc - s["final_test_accuracy"].as_f64().unwrap()).abs() < 1e-6);
        assert!((row[5].parse::<f64>().unwrap() - s["staleness"]["mean"].as_f64().unwrap()).abs() < 1e-4);
        assert_eq!(row[7], "0.5");
        let metrics = std::fs::read_to_string(dir.join("metrics.csv")).unwrap();
        let first_eval = metrics.lines().nth(1).unwrap().split(',').next().unwrap();
        assert_eq!(row[8], first_eval, "0.5 is reached at the first evaluation");
    }
    assert_eq!(summary(&hard)["staleness"]["mean"], 0.0, "hardsync has no staleness");

    let o = node(&["report", hard.to_str().unwrap(), "--out", out.to_str().unwrap(), "--target", "0.9999"]);
    assert!(o.status.success());
    assert!(text(&o.stdout).lines().nth(2).unwrap().contains("| — "), "{}", text(&o.stdout));
    assert_eq!(
        std::fs::read_to_string(out.join("report.csv")).unwrap().lines().nth(1).unwrap().split(',').nth(8),
        Some("")
    );
}

const METRICS: &str = "wall_seconds,epoch,updates,samples,train_loss,test_loss,test_accuracy,mean_staleness,samples_per_second\n";

#[test]
fn report_names_the_file_that_is_missing_or_malformed() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    std::fs::create_dir(&run).unwrap();
    // A real run's summary: the one schema every run writes and every report reads.
    let real = tmp.path().join("real");
    short_run(&real, &["cluster.learners=2", "protocol.kind=async"]);
    let out = tmp.path().join("out");
    let fails = |dir: &Path, what: &str| {
        let o = node(&["report", dir.to_str().unwrap(), "--out", out.to_str().unwrap()]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains(what), "the error does not name {what}: {err}");
        err
    };

    fails(&tmp.path().join("absent"), "absent: is not a run directory");
    fails(&run, "summary.json: cannot be read");
    std::fs::write(run.join("summary.json"), "{\"protocol\": 3}").unwrap();
    fails(&run, "summary.json: is not a run summary");
    std::fs::copy(real.join("summary.json"), run.join("summary.json")).unwrap();
    fails(&run, "metrics.csv: cannot be read");
    std::fs::write(run.join("metrics.csv"), format!("{METRICS}0.5,1,10,320,0.9,0.8,oops,1.5,640\n")).unwrap();
    let err = fails(&run, "metrics.csv: line 2: `test_accuracy` is \"oops\"");
    assert!(!err.contains("panicked"));

    std::fs::write(run.join("metrics.csv"), format!("{METRICS}0.5,1,10,320,0.9,0.8,0.7,1.5,640\n")).unwrap();
    let o = node(&["report", run.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(out.join("report.md").is_file() && out.join(COMPARISON_PLOTS[0]).is_file());

    let o = node(&["report", run.to_str().unwrap(), "--target", "2"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("--target"));
}
