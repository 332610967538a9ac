//! The run directory: `config.toml`, `metrics.csv`, `summary.json`, `checkpoint.safetensors`
//! and the plots, written from what the run recorded in memory.

use std::path::{Path, PathBuf};

use rudra_actors::RunReport;

use crate::checkpoint::Checkpoint;
use crate::summary::{RecordedRun, Summary, metrics_csv};
use crate::{Config, RuntimeError};

/// The scheduler's hold on a run directory: an exclusive lock on its `scheduler.lock`, which
/// the kernel releases when the process ends, however it ends.
#[derive(Debug)]
pub struct RunLock {
    _file: std::fs::File,
}

impl RunLock {
    /// The file that holds the lock, with the holder's process id in it.
    pub const FILE: &'static str = "scheduler.lock";

    /// Take `dir` (created if needed) for this process, or refuse, naming the process that
    /// holds it; a refused attempt changes nothing in the directory.
    pub fn take(dir: &Path) -> Result<Self, RuntimeError> {
        let path = dir.join(Self::FILE);
        let io = |source| RuntimeError::Io { path: path.clone(), source };
        std::fs::create_dir_all(dir).map_err(|source| RuntimeError::Io { path: dir.to_owned(), source })?;
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let holder = std::fs::read_to_string(&path).unwrap_or_default();
                return Err(RuntimeError::Input {
                    path: dir.to_owned(),
                    message: format!(
                        "another scheduler (process {}) holds this run directory; stop it, or give this one another --out",
                        holder.trim()
                    ),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
        }
        use std::io::Write;
        file.set_len(0).map_err(io)?;
        write!(file, "{}", std::process::id()).map_err(io)?;
        Ok(Self { _file: file })
    }
}

/// A run's output directory.
#[derive(Clone, Debug)]
pub struct RunDir {
    path: PathBuf,
}

impl RunDir {
    /// `out`, or `runs/<UTC timestamp>-<protocol>` when none is given; created if needed.
    pub fn create(out: Option<&Path>, protocol: &str) -> Result<Self, RuntimeError> {
        let path = out.map_or_else(
            || {
                let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
                let stamp: String = stamp.chars().filter(|c| c.is_ascii_digit() || *c == 'T').collect();
                PathBuf::from("runs").join(format!("{stamp}-{protocol}"))
            },
            Path::to_path_buf,
        );
        std::fs::create_dir_all(&path).map_err(|source| RuntimeError::Io { path: path.clone(), source })?;
        Ok(Self { path })
    }

    /// The directory.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Write the file `name` in the directory (into a new file renamed over the old, so that a
    /// reader, or a crash, never sees half of it).
    pub fn write_file(&self, name: &str, contents: &str) -> Result<(), RuntimeError> {
        self.replace(name, |tmp| {
            std::fs::write(tmp, contents).map_err(|source| RuntimeError::Io { path: tmp.to_owned(), source })
        })
    }

    /// Replace the file `name` with what `write` writes into the path it is given: the
    /// directory is made again if it went away, and a write that fails (a full disk) leaves no
    /// file behind but the one it would have replaced.
    fn replace(
        &self,
        name: &str,
        write: impl FnOnce(&Path) -> Result<(), RuntimeError>,
    ) -> Result<(), RuntimeError> {
        let (path, tmp) = (self.path.join(name), self.path.join(format!("{name}.tmp")));
        if !self.path.is_dir() {
            tracing::warn!("{} went away: making it again", self.path.display());
            std::fs::create_dir_all(&self.path)
                .map_err(|source| RuntimeError::Io { path: self.path.clone(), source })?;
        }
        let written = write(&tmp)
            .and_then(|()| std::fs::rename(&tmp, &path).map_err(|source| RuntimeError::Io { path, source }));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }

    /// `config.toml`, the configuration as resolved.
    pub fn write_config(&self, config: &Config) -> Result<(), RuntimeError> {
        self.write_file("config.toml", config.to_toml())
    }

    /// `checkpoint.safetensors` (see [`crate::checkpoint`]) with the run's settings as
    /// metadata; replaced atomically.
    pub fn write_checkpoint(&self, config: &Config, params: &[f32]) -> Result<(), RuntimeError> {
        let c = &config.cluster;
        let run = [
            ("protocol", config.protocol_name().to_owned()),
            ("n", config.sync_n().to_string()),
            ("learners", c.learners.to_string()),
            ("shards", c.shards.to_string()),
            ("batch_size", c.batch_size.to_string()),
            ("epochs", c.epochs.to_string()),
            ("seed", c.seed.to_string()),
            ("dataset", config.data.kind.as_str().to_owned()),
        ];
        self.replace("checkpoint.safetensors", |tmp| Checkpoint::write(tmp, &config.model, params, &run))
    }

    /// Everything a finished run leaves: `summary.json` first (small, and what says how the
    /// run ended), then `metrics.csv`, `timeline.json` (membership changes and faults, in
    /// order), `checkpoint.safetensors` and the plots, drawn from the run as recorded. A file
    /// after the summary that cannot be written (a full disk) or drawn is a warning: the run
    /// itself succeeded, and its summary says how. Returns the run as recorded.
    pub fn record(&self, config: &Config, report: &RunReport) -> Result<RecordedRun, RuntimeError> {
        let run = RecordedRun::of(&self.path, config, report);
        self.write_summary(&run.summary)?;
        let rest = [
            ("metrics were not written", self.record_so_far(report)),
            ("checkpoint was not written", self.write_checkpoint(config, &report.params)),
            ("plots were not drawn", crate::plot::draw_run(&run).map(drop)),
        ];
        for (what, e) in rest.into_iter().filter_map(|(what, r)| r.err().map(|e| (what, e))) {
            tracing::warn!("the run's {what} ({e}); its summary is written");
        }
        Ok(run)
    }

    /// `metrics.csv` and `timeline.json` of what a run has recorded so far (rewritten as it
    /// goes, so a run that dies keeps what it measured).
    pub fn record_so_far(&self, so_far: &RunReport) -> Result<(), RuntimeError> {
        self.write_file("metrics.csv", &metrics_csv(&so_far.metrics))?;
        let timeline = serde_json::to_string_pretty(&so_far.timeline)
            .map_err(|e| RuntimeError::Config(e.to_string()))?;
        self.write_file("timeline.json", &timeline)
    }

    /// A run that stopped on `error`, having recorded `so_far` (nothing, if it failed to
    /// start): what it recorded, and `summary.json` with `outcome = "failed"` and the error, so
    /// that no run directory is left half written.
    pub fn record_failure(
        &self,
        config: &Config,
        so_far: &RunReport,
        error: &RuntimeError,
    ) -> Result<(), RuntimeError> {
        let mut summary = Summary::new(config, so_far);
        summary.outcome = "failed".into();
        summary.error = Some(error.to_string());
        self.write_summary(&summary)?;
        self.record_so_far(so_far)
    }

    fn write_summary(&self, summary: &Summary) -> Result<(), RuntimeError> {
        let json = serde_json::to_string_pretty(summary).map_err(|e| RuntimeError::Config(e.to_string()))?;
        self.write_file("summary.json", &json)
    }
}
