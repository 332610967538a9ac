//! PNG plots of finished runs, drawn with `plotters`.
//!
//! Every run directory gets [`RUN_PLOTS`]: test accuracy and train loss against wall time and
//! against updates, the staleness histogram, and samples/s per learner. `rudra-node report`
//! draws several runs on the same accuracy and loss axes ([`COMPARISON_PLOTS`]).

use std::error::Error;
use std::ops::Range;
use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use rudra_actors::MetricsRow;

use crate::RuntimeError;
use crate::summary::RecordedRun;

/// The plots of one run, written into its directory.
pub const RUN_PLOTS: [&str; 4] =
    ["accuracy_loss_vs_time.png", "accuracy_loss_vs_updates.png", "staleness.png", "samples_per_second.png"];

/// The plots of a comparison of runs, written into the report directory.
pub const COMPARISON_PLOTS: [&str; 2] = ["accuracy_loss_vs_time.png", "accuracy_loss_vs_updates.png"];

const FONT: &str = "sans-serif";
type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;
type Chart<'a, 'b> = ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;
type Drawn = Result<(), Box<dyn Error>>;

/// The x axis of a curve.
#[derive(Clone, Copy)]
enum Axis {
    WallTime,
    Updates,
}

impl Axis {
    fn of(self, row: &MetricsRow) -> f64 {
        match self {
            Self::WallTime => row.wall_seconds,
            Self::Updates => row.updates as f64,
        }
    }

    /// A tick label: whole updates, seconds without trailing zeros.
    fn tick(self, v: f64) -> String {
        match self {
            Self::Updates => format!("{v:.0}"),
            Self::WallTime => format!("{v:.2}").trim_end_matches('0').trim_end_matches('.').to_owned(),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::WallTime => "wall time (s)",
            Self::Updates => "updates",
        }
    }
}

/// Draw [`RUN_PLOTS`] of `run` into its directory; returns the files written.
pub fn draw_run(run: &RecordedRun) -> Result<Vec<PathBuf>, RuntimeError> {
    let dir = &run.dir;
    let runs = std::slice::from_ref(run);
    let [time, updates, staleness, throughput] = RUN_PLOTS.map(|name| dir.join(name));
    draw(&time, |a| curves(a, runs, Axis::WallTime))?;
    draw(&updates, |a| curves(a, runs, Axis::Updates))?;
    draw(&staleness, |a| staleness_histogram(a, run))?;
    draw(&throughput, |a| samples_per_second(a, run))?;
    Ok(vec![time, updates, staleness, throughput])
}

/// Draw [`COMPARISON_PLOTS`] of `runs` into `out`, one line and legend entry per run;
/// returns the files written.
pub fn draw_comparison(runs: &[RecordedRun], out: &Path) -> Result<Vec<PathBuf>, RuntimeError> {
    let [time, updates] = COMPARISON_PLOTS.map(|name| out.join(name));
    draw(&time, |a| curves(a, runs, Axis::WallTime))?;
    draw(&updates, |a| curves(a, runs, Axis::Updates))?;
    Ok(vec![time, updates])
}

/// One line of a study's figure: its label and, per step of the x axis, the value (NaN: none).
pub type StudyLine = (String, Vec<f64>);

/// A study's figure at `path`: `y_label` against the steps of the x axis (`x_label`, one tick
/// per step, labelled `steps`), one line per entry of `lines`.
pub fn draw_study(
    path: &Path,
    (x_label, steps): (&str, &[String]),
    y_label: &str,
    lines: &[StudyLine],
) -> Result<(), RuntimeError> {
    draw(path, |root| {
        let x = -0.25..(steps.len().max(1) as f64 - 0.75);
        let y = padded(lines.iter().flat_map(|(_, v)| v.iter().copied()), 0.0..f64::INFINITY);
        let caption = format!("{y_label} vs {x_label}");
        let mut chart = framed(root, &caption).build_cartesian_2d(x, y)?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .x_labels(steps.len().max(2))
            .x_label_formatter(&|v| {
                let i = v.round();
                let label = (i >= 0.0 && (v - i).abs() < 1e-6).then(|| steps.get(i as usize)).flatten();
                label.cloned().unwrap_or_default()
            })
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 16))
            .draw()?;
        for (i, (label, values)) in lines.iter().enumerate() {
            let points: Vec<(f64, f64)> = values
                .iter()
                .enumerate()
                .map(|(x, &y)| (x as f64, y))
                .filter(|(_, y)| y.is_finite())
                .collect();
            line(&mut chart, label, &points, Palette99::pick(i).to_rgba())?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)
    })
}

/// A 960×900 white PNG at `path`, drawn by `paint`; nothing is left at `path` if it fails.
fn draw(path: &Path, paint: impl FnOnce(&Area<'_>) -> Drawn) -> Result<(), RuntimeError> {
    let drawn = {
        let root = BitMapBackend::new(path, (960, 900)).into_drawing_area();
        root.fill(&WHITE).map_err(Into::into).and_then(|()| paint(&root)).and_then(|()| Ok(root.present()?))
    };
    drawn.map_err(|e| {
        // Dropping the backend above saves whatever was drawn; a half-drawn image helps no one.
        let _ = std::fs::remove_file(path);
        RuntimeError::Plot { path: path.to_owned(), message: e.to_string() }
    })
}

/// `0..max` of `values` with a little room, or `0..1` when there is nothing to show.
fn from_zero(values: impl Iterator<Item = f64>) -> Range<f64> {
    let max = values.filter(|v| v.is_finite()).fold(0.0, f64::max);
    0.0..if max > 0.0 { max * 1.05 } else { 1.0 }
}

/// The range of `values` with 5% room on either side, kept within `bounds`.
fn padded(values: impl Iterator<Item = f64>, bounds: Range<f64>) -> Range<f64> {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return bounds.start..(bounds.start + 1.0).min(bounds.end);
    }
    let pad = ((hi - lo) * 0.05).max(0.01);
    (lo - pad).max(bounds.start)..(hi + pad).min(bounds.end)
}

/// A chart frame on `area` with `caption` and room for axis labels.
fn framed<'a, 'b, 'c>(area: &'a Area<'c>, caption: &str) -> ChartBuilder<'a, 'b, BitMapBackend<'c>> {
    let mut frame = ChartBuilder::on(area);
    frame.caption(caption, (FONT, 24)).margin(14).x_label_area_size(45).y_label_area_size(80);
    frame
}

/// A line through `points` with a dot on each, and its legend entry.
fn line(chart: &mut Chart<'_, '_>, label: &str, points: &[(f64, f64)], color: RGBAColor) -> Drawn {
    chart
        .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3)));
    chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
    Ok(())
}

/// The legend in `corner`.
fn legend<'a, 'b: 'a>(chart: &mut Chart<'a, 'b>, corner: SeriesLabelPosition) -> Drawn {
    chart
        .configure_series_labels()
        .position(corner)
        .label_font((FONT, 16))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// What a curve panel shows.
#[derive(Clone, Copy)]
enum Metric {
    TestAccuracy,
    TrainLoss,
}

impl Metric {
    fn of(self, row: &MetricsRow) -> f64 {
        match self {
            Self::TestAccuracy => row.test_accuracy,
            Self::TrainLoss => row.train_loss,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::TestAccuracy => "test accuracy",
            Self::TrainLoss => "train loss",
        }
    }

    /// The values it can take.
    fn bounds(self) -> Range<f64> {
        match self {
            Self::TestAccuracy => 0.0..1.0,
            Self::TrainLoss => 0.0..f64::INFINITY,
        }
    }

    /// Where its curves leave room for the legend: accuracy rises, loss falls.
    fn legend_corner(self) -> SeriesLabelPosition {
        match self {
            Self::TestAccuracy => SeriesLabelPosition::LowerRight,
            Self::TrainLoss => SeriesLabelPosition::UpperRight,
        }
    }
}

/// Test accuracy (top) and train loss (bottom) against `axis`, one line per run.
fn curves(root: &Area<'_>, runs: &[RecordedRun], axis: Axis) -> Drawn {
    let (top, bottom) = root.split_vertically(450);
    let rows = || runs.iter().flat_map(|r| &r.metrics);
    let x = from_zero(rows().map(|m| axis.of(m)));
    for (area, metric) in [(&top, Metric::TestAccuracy), (&bottom, Metric::TrainLoss)] {
        let y = padded(rows().map(|m| metric.of(m)), metric.bounds());
        let caption = format!("{} vs {}", metric.label(), axis.label());
        let mut chart = framed(area, &caption).build_cartesian_2d(x.clone(), y)?;
        chart
            .configure_mesh()
            .x_desc(axis.label())
            .y_desc(metric.label())
            .x_label_formatter(&|v| axis.tick(*v))
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 16))
            .draw()?;
        for (i, run) in runs.iter().enumerate() {
            let points: Vec<(f64, f64)> = run
                .metrics
                .iter()
                .map(|m| (axis.of(m), metric.of(m)))
                .filter(|(_, v)| v.is_finite())
                .collect();
            line(&mut chart, &run.label, &points, Palette99::pick(i).to_rgba())?;
        }
        legend(&mut chart, metric.legend_corner())?;
    }
    Ok(())
}

/// Applied gradients per staleness σ.
fn staleness_histogram(root: &Area<'_>, run: &RecordedRun) -> Drawn {
    let s = &run.summary.staleness;
    let caption = format!("{}: staleness of applied gradients, ⟨σ⟩ = {:.2}", run.label, s.mean);
    histogram(root, &caption, &s.histogram, 14)
}

/// Several staleness histograms side by side at `path`, each captioned with its label and ⟨σ⟩.
pub fn draw_histograms(path: &Path, histograms: &[(String, &[u64])]) -> Result<(), RuntimeError> {
    draw(path, |root| {
        let cols = (histograms.len() as f64).sqrt().ceil().max(1.0) as usize;
        let rows = histograms.len().div_ceil(cols).max(1);
        for (area, (label, counts)) in root.split_evenly((rows, cols)).iter().zip(histograms) {
            let applied: u64 = counts.iter().sum();
            let sum: u64 = counts.iter().zip(0..).map(|(&n, sigma)| n * sigma).sum();
            let mean = if applied == 0 { 0.0 } else { sum as f64 / applied as f64 };
            histogram(area, &format!("{label}: ⟨σ⟩ = {mean:.2}"), counts, (14 / cols as u32).max(8))?;
        }
        Ok(())
    })
}

/// Applied gradients per staleness σ, as bars, in `root`.
fn histogram(root: &Area<'_>, caption: &str, counts: &[u64], font: u32) -> Drawn {
    let sigmas = counts.len().max(1) as u64;
    let top = counts.iter().copied().max().unwrap_or(0).max(1);
    let mut frame = ChartBuilder::on(root);
    frame.caption(caption, (FONT, font + 10)).margin(font).x_label_area_size(font * 3 + 3);
    let mut chart = (frame.y_label_area_size(font * 6))
        .build_cartesian_2d((0..sigmas).into_segmented(), 0..top + top / 20 + 1)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc("σ (updates between a gradient's pull and its application)")
        .y_desc("gradients")
        .label_style((FONT, font))
        .axis_desc_style((FONT, font + 2))
        .draw()?;
    chart.draw_series(counts.iter().zip(0..).map(|(&count, sigma)| {
        let mut bar = Rectangle::new(
            [(SegmentValue::Exact(sigma), 0), (SegmentValue::Exact(sigma + 1), count)],
            BLUE.mix(0.7).filled(),
        );
        bar.set_margin(0, 0, 3, 3);
        bar
    }))?;
    Ok(())
}

/// Samples/s between evaluations of the count `samples` of a row, against wall time.
fn rate_between(rows: &[MetricsRow], samples: impl Fn(&MetricsRow) -> u64) -> Vec<(f64, f64)> {
    let mut last = (0.0, 0);
    rows.iter()
        .filter_map(|m| {
            let (t, n) = std::mem::replace(&mut last, (m.wall_seconds, samples(m)));
            (m.wall_seconds > t)
                .then(|| (m.wall_seconds, samples(m).saturating_sub(n) as f64 / (m.wall_seconds - t)))
        })
        .collect()
}

/// Samples/s between evaluations of each learner and of all of them, against wall time.
fn samples_per_second(root: &Area<'_>, run: &RecordedRun) -> Drawn {
    let learners = run.metrics.iter().map(|m| m.learner_samples.len()).max().unwrap_or(0);
    let per_learner: Vec<Vec<(f64, f64)>> = (0..learners)
        .map(|l| rate_between(&run.metrics, |m| m.learner_samples.get(l).copied().unwrap_or(0)))
        .collect();
    let total = rate_between(&run.metrics, |m| m.samples);
    let x = from_zero(run.metrics.iter().map(|m| m.wall_seconds));
    let y = from_zero(per_learner.iter().flatten().chain(&total).map(|p| p.1));
    let caption = format!("{}: samples/s of each of the {} learners", run.label, run.summary.learners);
    let mut chart = framed(root, &caption).build_cartesian_2d(x, y)?;
    chart
        .configure_mesh()
        .x_desc(Axis::WallTime.label())
        .y_desc("samples/s")
        .x_label_formatter(&|v| Axis::WallTime.tick(*v))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .draw()?;
    line(&mut chart, "all learners", &total, Palette99::pick(0).to_rgba())?;
    for (l, points) in per_learner.iter().enumerate() {
        line(&mut chart, &format!("learner {l}"), points, Palette99::pick(l + 1).to_rgba())?;
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_leave_room_and_stay_in_bounds() {
        assert_eq!(from_zero([2.0, 4.0, f64::NAN].into_iter()), 0.0..4.2);
        assert_eq!(from_zero(std::iter::empty()), 0.0..1.0);
        let r = padded([0.5, 0.9].into_iter(), 0.0..1.0);
        assert!((r.start - 0.48).abs() < 1e-9 && (r.end - 0.92).abs() < 1e-9, "{r:?}");
        let r = padded([0.9, 0.99].into_iter(), 0.0..1.0);
        assert!((r.start - 0.89).abs() < 1e-9 && r.end == 1.0, "{r:?}");
        assert_eq!(padded([0.5].into_iter(), 0.0..1.0), 0.49..0.51);
        assert_eq!(padded([f64::NAN].into_iter(), 0.0..1.0), 0.0..1.0);
        assert_eq!(padded(std::iter::empty(), 0.0..f64::INFINITY), 0.0..1.0);
    }

    #[test]
    fn rates_are_taken_between_evaluations() {
        let row = |t: f64, learner_samples: Vec<u64>| MetricsRow {
            wall_seconds: t,
            epoch: 0.0,
            updates: 0,
            samples: learner_samples.iter().sum(),
            train_loss: 0.0,
            test_loss: 0.0,
            test_accuracy: 0.0,
            mean_staleness: 0.0,
            samples_per_second: 0.0,
            learner_samples,
            bytes: rudra_actors::BytesMoved::default(),
            learner_seconds: Vec::new(),
            goodput: f64::NAN,
        };
        let rows = [row(1.0, vec![100, 50]), row(1.0, vec![100, 50]), row(3.0, vec![300, 60])];
        assert_eq!(rate_between(&rows, |m| m.learner_samples[0]), [(1.0, 100.0), (3.0, 100.0)]);
        assert_eq!(rate_between(&rows, |m| m.learner_samples[1]), [(1.0, 50.0), (3.0, 5.0)]);
        assert_eq!(rate_between(&rows, |m| m.samples), [(1.0, 150.0), (3.0, 105.0)]);
    }

    #[test]
    fn ticks_read_as_whole_updates_and_plain_seconds() {
        assert_eq!(Axis::Updates.tick(300.0), "300");
        assert_eq!(Axis::WallTime.tick(0.2), "0.2");
        assert_eq!(Axis::WallTime.tick(2.0), "2");
        assert_eq!(Axis::WallTime.tick(0.0), "0");
        assert_eq!(Axis::WallTime.tick(10.0), "10");
        assert_eq!(Axis::WallTime.tick(12.25), "12.25");
    }
}
