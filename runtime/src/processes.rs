//! A run as `rudra-node` processes on this host, over loopback QUIC with mutual TLS: the
//! scheduler, shards, aggregators and learners of its configuration, each logging to
//! `LOGS/NAME.log`, any of which can be killed (SIGKILL) and started again with the command it
//! had. The cluster benchmark and `rudra-node experiment` run on it.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rudra_actors::TimelineEntry;
use rudra_transport::Role;
use rudra_transport::tls::CertDir;

use crate::RuntimeError;
use crate::config::Kill;
use crate::node::STATE_FILE;

/// How to start the processes of one run.
pub struct Launch<'a> {
    /// The certificate directory: a CA and every process's certificate (see [`issue_certs`]).
    pub certs: &'a Path,
    /// Where each process logs, as `NAME.log` (appended to by a process started again).
    pub logs: &'a Path,
    /// The scheduler's run directory (`--out`).
    pub run_dir: &'a Path,
    /// The scheduler's `--config` file, if any, and its `--set` assignments.
    pub config: (Option<&'a Path>, &'a [String]),
    /// How many shards, learners and learner groups (each group beyond one has an aggregator).
    pub nodes: (u32, u32, u32),
    /// Every process's `--connect-timeout`.
    pub connect_timeout: Duration,
    /// `RUST_LOG` of every process.
    pub log_filter: &'static str,
    /// Where learners reach a shard that listens at the given address (a relay in front of it,
    /// which this returns the address of); none: at that address.
    pub shard_front: Option<&'a ShardFront<'a>>,
}

/// Puts something in front of a shard listening at an address, and says where to reach it.
pub type ShardFront<'a> = dyn Fn(SocketAddr) -> Result<SocketAddr, RuntimeError> + 'a;

/// The names of a run's processes: shards, then the groups' aggregators (with more than one
/// group), then learners, then the scheduler.
#[must_use]
pub fn names((shards, learners, groups): (u32, u32, u32)) -> Vec<String> {
    let aggregators = if groups > 1 { groups } else { 0 };
    (0..shards)
        .map(|s| format!("shard-{s}"))
        .chain((0..aggregators).map(|g| format!("aggregator-{g}")))
        .chain((0..learners).map(|l| format!("learner-{l}")))
        .chain(std::iter::once("scheduler".to_owned()))
        .collect()
}

/// A CA in `dir` and a certificate for each of `names`.
pub fn issue_certs(dir: &Path, names: &[String]) -> Result<(), RuntimeError> {
    let certs = CertDir::new(dir);
    certs.init()?;
    for name in names {
        certs.issue(name)?;
    }
    Ok(())
}

/// How the processes ended: the exit code of each one's last incarnation (`None`: ended by a
/// signal, such as a kill it was not started again after), by name; and the kills and restarts
/// carried out, as timeline entries.
pub struct Ended {
    /// `(name, exit code)`, in the order of [`names`].
    pub exits: Vec<(String, Option<i32>)>,
    /// What was done to the processes, in seconds since the run started.
    pub injected: Vec<TimelineEntry>,
}

impl Ended {
    /// An error naming every process that did not exit 0, if any did not.
    pub fn require_success(&self, what: &str) -> Result<(), RuntimeError> {
        let failed: Vec<String> = (self.exits.iter())
            .filter(|(_, code)| *code != Some(0))
            .map(|(name, code)| {
                format!("{name} ({})", code.map_or_else(|| "a signal".into(), |c| c.to_string()))
            })
            .collect();
        if failed.is_empty() {
            return Ok(());
        }
        Err(RuntimeError::Config(format!("{what}: {} exited with an error", failed.join(", "))))
    }
}

/// One process: its name, its command's arguments, and its present incarnation.
struct Process {
    name: String,
    args: Vec<OsString>,
    child: Option<Child>,
    status: Option<ExitStatus>,
}

/// The processes of one run, killed when dropped so that none outlives its caller.
pub struct Processes {
    exe: PathBuf,
    logs: PathBuf,
    log_filter: &'static str,
    procs: Vec<Process>,
    run_dir: PathBuf,
    started: Instant,
}

fn process_error(what: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Config(format!("the run's processes: {what}"))
}

/// A free UDP port on 127.0.0.1.
fn free_port() -> Result<u16, RuntimeError> {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").map_err(process_error)?;
    Ok(socket.local_addr().map_err(process_error)?.port())
}

impl Processes {
    /// Start the shards, aggregators and learners, then the scheduler (this binary,
    /// `rudra-node`). Shards listen at fixed ports, so that one started again is where the learners know it.
    pub fn start(launch: &Launch) -> Result<Self, RuntimeError> {
        let exe = std::env::current_exe().map_err(process_error)?;
        std::fs::create_dir_all(launch.logs)
            .map_err(|source| RuntimeError::Io { path: launch.logs.to_owned(), source })?;
        let scheduler = format!("127.0.0.1:{}", free_port()?);
        let timeout = humantime::format_duration(launch.connect_timeout).to_string();
        let common = |name: &str| -> Vec<OsString> {
            let mut args: Vec<OsString> = ["--name", name, "--connect-timeout", &timeout, "--certs"]
                .into_iter()
                .map(Into::into)
                .collect();
            args.push(launch.certs.into());
            args
        };
        let mut procs = Vec::new();
        for name in names(launch.nodes) {
            let mut args = common(&name);
            if name == "scheduler" {
                args.extend(["--role", "scheduler", "--listen", &scheduler].map(OsString::from));
                args.extend([OsString::from("--out"), launch.run_dir.into()]);
                if let Some(file) = launch.config.0 {
                    args.extend([OsString::from("--config"), file.into()]);
                }
                for s in launch.config.1 {
                    args.extend(["--set", s].map(OsString::from));
                }
            } else {
                let role = Role::of_name(&name).map_or("learner", Role::as_str);
                args.extend(["--role", role, "--scheduler", &scheduler].map(OsString::from));
                if role == "shard" {
                    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()?));
                    args.extend(["--listen".into(), listen.to_string().into()]);
                    if let Some(front) = launch.shard_front {
                        args.extend(["--advertise".into(), front(listen)?.to_string().into()]);
                    }
                }
            }
            procs.push(Process { name, args, child: None, status: None });
        }
        let mut this = Self {
            exe,
            logs: launch.logs.to_owned(),
            log_filter: launch.log_filter,
            procs,
            run_dir: launch.run_dir.to_owned(),
            started: Instant::now(),
        };
        for i in 0..this.procs.len() {
            this.spawn(i)?;
        }
        Ok(this)
    }

    /// Start process `i` (again), appending to its log.
    fn spawn(&mut self, i: usize) -> Result<(), RuntimeError> {
        let p = &mut self.procs[i];
        let path = self.logs.join(format!("{}.log", p.name));
        let log = (OpenOptions::new().create(true).append(true).open(&path))
            .map_err(|source| RuntimeError::Io { path, source })?;
        let child = Command::new(&self.exe)
            .args(&p.args)
            .env("RUST_LOG", self.log_filter)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| process_error(format!("{} did not start: {e}", p.name)))?;
        p.child = Some(child);
        p.status = None;
        Ok(())
    }

    /// Wait for every process to exit, carrying out `kills` on the way; give up `limit` after
    /// the start. A kill's time counts from the run's start, when the scheduler has gathered its
    /// nodes and first writes its state (the clock of the run's timeline); one due after its
    /// process has exited is moot.
    pub fn run(&mut self, kills: &[Kill], limit: Duration) -> Result<Ended, RuntimeError> {
        let index = |name: &str| self.procs.iter().position(|p| p.name == name);
        let mut due: Vec<(usize, Duration, Action)> = (kills.iter())
            .map(|k| {
                let i =
                    index(&k.node).ok_or_else(|| process_error(format!("no process is named {}", k.node)))?;
                Ok((i, k.at, Action::Kill { restart_after: k.restart_after }))
            })
            .collect::<Result<_, RuntimeError>>()?;
        let mut injected = Vec::new();
        let mut run_started: Option<Instant> = None;
        loop {
            if run_started.is_none() && self.run_dir.join(STATE_FILE).is_file() {
                run_started = Some(Instant::now());
            }
            let now = run_started.map_or(Duration::ZERO, |t| t.elapsed());
            while let Some(next) = due.iter().position(|&(_, at, _)| run_started.is_some() && at <= now) {
                let (p, _, action) = due.swap_remove(next);
                let name = self.procs[p].name.clone();
                match (action, &mut self.procs[p].child) {
                    (Action::Kill { restart_after }, Some(child)) => {
                        let _ = child.kill();
                        self.procs[p].status = Some(child.wait().map_err(process_error)?);
                        self.procs[p].child = None;
                        injected.push(entry(now, format!("{name} killed (SIGKILL)")));
                        if let Some(after) = restart_after {
                            due.push((p, now + after, Action::Restart));
                        }
                    }
                    // It exited before its kill was due.
                    (Action::Kill { .. }, None) => {}
                    (Action::Restart, _) => {
                        self.spawn(p)?;
                        injected.push(entry(now, format!("{name} started again")));
                    }
                }
            }
            for p in &mut self.procs {
                if let Some(child) = &mut p.child
                    && let Some(status) = child.try_wait().map_err(process_error)?
                {
                    p.status = Some(status);
                    p.child = None;
                }
            }
            let restarts_due = due.iter().any(|(_, _, a)| matches!(a, Action::Restart));
            if self.procs.iter().all(|p| p.child.is_none()) && !restarts_due {
                break;
            }
            if self.started.elapsed() > limit {
                return Err(process_error(format!(
                    "the run did not end within {limit:?}; see the logs in {}",
                    self.logs.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let exits = (self.procs.iter()).map(|p| (p.name.clone(), p.status.and_then(|s| s.code()))).collect();
        Ok(Ended { exits, injected })
    }
}

/// What is due to a process.
#[derive(Clone, Copy)]
enum Action {
    Kill { restart_after: Option<Duration> },
    Restart,
}

fn entry(at: Duration, what: String) -> TimelineEntry {
    TimelineEntry { seconds: at.as_secs_f64(), kind: "injected".into(), what }
}

impl Drop for Processes {
    fn drop(&mut self) {
        for child in self.procs.iter_mut().filter_map(|p| p.child.as_mut()) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
