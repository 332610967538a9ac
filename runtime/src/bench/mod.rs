//! `rudra-node bench`: measurements against baselines taken in the same run, reported as
//! medians and ratios.
//!
//! - [`compute`]: the CPU backend's GEMM against numpy (OpenBLAS), and MLP and CNN
//!   training steps on every backend present.
//! - [`protocols`]: every protocol with its defaults: final test accuracy and throughput.
//! - [`training`]: training throughput of in-process clusters against a bare SGD loop.
//! - [`agreement`]: ⟨σ⟩ of the simulator against the local runtime on the same settings.
//! - [`cluster`]: the peers' workload as processes over loopback QUIC, per payload codec,
//!   against the same run in memory.
//! - [`latency`]: the same workload as processes with the learners' links through a delaying
//!   relay at several round trips, against the direct link.
//! - [`groups`]: learner groups across processes, each group's aggregator a process, against
//!   the same processes without groups.
//! - [`simulator`]: events per second of the simulator with 10,000 virtual learners.
//! - [`transport`]: QUIC push and pull of 4 MiB payloads against TCP loopback and memcpy,
//!   and validate-and-view of a received frame against copying it.

pub mod agreement;
pub mod cluster;
pub mod compute;
pub mod groups;
pub mod latency;
pub mod protocols;
pub mod simulator;
pub mod training;
pub mod transport;

/// One measured setting.
#[derive(Clone, Debug)]
pub struct BenchRow {
    /// What ran.
    pub name: String,
    /// The median measurement, in `unit`.
    pub value: f64,
    /// Its unit.
    pub unit: &'static str,
    /// Ratio to the row's baseline, with the baseline's name.
    pub ratio: Option<(f64, String)>,
}

/// The measures of every run of each setting: by setting, by measure, by run.
pub type Measures = Vec<Vec<Vec<f64>>>;

/// Run `measure(i, dir)` for every one of `settings` settings, `repeats` times interleaved,
/// each run in a directory of its own under `tmp`; each run gives the same measures, in order.
pub fn interleaved<const N: usize>(
    settings: usize,
    repeats: usize,
    tmp: &std::path::Path,
    mut measure: impl FnMut(usize, &std::path::Path) -> Result<[f64; N], crate::RuntimeError>,
) -> Result<Measures, crate::RuntimeError> {
    let mut measured: Measures = vec![vec![Vec::new(); N]; settings];
    for round in 0..repeats.max(1) {
        for (i, m) in measured.iter_mut().enumerate() {
            let dir = tmp.join(format!("r{round}-{i}"));
            std::fs::create_dir_all(&dir)
                .map_err(|source| crate::RuntimeError::Io { path: dir.clone(), source })?;
            for (runs, value) in m.iter_mut().zip(measure(i, &dir)?) {
                runs.push(value);
            }
        }
    }
    Ok(measured)
}

/// For each of `names`: its median samples/s (the first measure) as a ratio to the first
/// setting's, named `baseline`, and the medians of its further measures, each `(what, unit)`.
#[must_use]
pub fn throughput_rows(
    names: Vec<String>,
    measured: Measures,
    baseline: &str,
    further: &[(&str, &'static str)],
) -> Vec<BenchRow> {
    let base = measured.first().and_then(|m| m.first()).map_or(f64::NAN, |v| median(v.clone()));
    let mut rows = Vec::new();
    for (name, measures) in names.into_iter().zip(measured) {
        let mut measures = measures.into_iter();
        let sps = median(measures.next().unwrap_or_default());
        rows.push(BenchRow {
            name: format!("{name}: samples/s"),
            value: sps,
            unit: "samples/s",
            ratio: Some((sps / base, baseline.to_owned())),
        });
        for (&(what, unit), runs) in further.iter().zip(measures) {
            rows.push(BenchRow { name: format!("{name}: {what}"), value: median(runs), unit, ratio: None });
        }
    }
    rows
}

/// The median of `v` (NaN when it is empty).
#[must_use]
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Print rows as a table.
pub fn print(rows: &[BenchRow]) {
    println!("{:<48} {:>14} {:<10} {:>8}  baseline", "setting", "median", "unit", "ratio");
    for r in rows {
        let (ratio, base) =
            r.ratio.as_ref().map_or((String::new(), ""), |(x, b)| (format!("{x:.3}"), b.as_str()));
        let digits = if r.value.abs() < 100.0 { 3 } else { 1 };
        println!("{:<48} {:>14.digits$} {:<10} {:>8}  {}", r.name, r.value, r.unit, ratio, base);
    }
}

/// `rows` of `suite` as a markdown table, headed by the machine and the date they were
/// measured on, for the book's performance chapter.
#[must_use]
pub fn markdown(suite: &str, rows: &[BenchRow]) -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_else(|| "an unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let date = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
    let mut md = format!(
        "`rudra-node bench --suite {suite}` on {cpu} ({cores} cores), {date}; medians.\n\n\
         | setting | median | unit | ratio | baseline |\n|---|---:|---|---:|---|\n"
    );
    for r in rows {
        let (ratio, base) =
            r.ratio.as_ref().map_or((String::new(), ""), |(x, b)| (format!("{x:.3}"), b.as_str()));
        md += &format!("| {} | {:.3} | {} | {ratio} | {base} |\n", r.name, r.value, r.unit);
    }
    md
}
