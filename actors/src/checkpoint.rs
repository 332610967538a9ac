//! A shard's checkpoint, `DIR/shard-N.safetensors`: its [`ShardState`] as safetensors, so a
//! restarted shard continues where the checkpoint left it and other tools can read it too.
//!
//! Tensors: `values` (F32 `[len]`: the parameters or the center) and, for MDOWNPOUR,
//! `velocity`. String metadata: `shard`, `job` (the run it belongs to), `clock`, `received`,
//! `last_pushed` (the pushes each learner had applied: `learner:seq` pairs joined by commas,
//! `seq` the newest, followed by `/bits` when some of the 64 steps before it were applied too,
//! bit d − 1 for step seq − d)
//! and `checksum`, an FNV-1a hash of the tensors' bytes and every other metadata entry.
//!
//! A checkpoint is trusted only when it is whole: a damaged file (its checksum), one of another
//! shard, job or model size, one naming a learner the run does not have, or one holding a NaN
//! or ±Inf value is refused, naming the file.
//!
//! A checkpoint is written to a temporary file, flushed to disk and renamed over the last one,
//! so a crash at any moment leaves either the old checkpoint or the new one, never half of one.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::PathBuf;

use rudra_transport::{Clock, LearnerId, ShardId};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use crate::ActorError;
use rudra_proto::{PushWindow, ShardState};

/// Where a shard keeps its checkpoints and how often it writes one, and the run they belong to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoints {
    /// The directory; each shard writes `shard-N.safetensors` in it.
    pub dir: PathBuf,
    /// A checkpoint after every this many updates (at least 1).
    pub every_updates: u64,
    /// The run's identity: a checkpoint written by another run is refused.
    pub job: String,
    /// λ of the run: a checkpoint naming another learner is refused.
    pub learners: u32,
}

/// A fresh identity for a run: 16 hex digits from the clock and the process.
#[must_use]
pub fn new_job_id() -> String {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let mut h = Fnv::default();
    h.bytes(&nanos.to_le_bytes());
    h.bytes(&std::process::id().to_le_bytes());
    format!("{:016x}", h.0)
}

/// FNV-1a, 64 bits.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// The checksum of a checkpoint: its tensors' bytes, then its metadata (but the checksum) in
/// key order.
fn checksum(tensors: &[&[u8]], metadata: &BTreeMap<String, String>) -> String {
    let mut h = Fnv::default();
    for t in tensors {
        h.bytes(&(t.len() as u64).to_le_bytes());
        h.bytes(t);
    }
    for (k, v) in metadata.iter().filter(|(k, _)| *k != "checksum") {
        h.bytes(k.as_bytes());
        h.bytes(&[0]);
        h.bytes(v.as_bytes());
        h.bytes(&[0]);
    }
    format!("{:016x}", h.0)
}

impl Checkpoints {
    /// The checkpoint file of `shard`.
    #[must_use]
    pub fn path(&self, shard: ShardId) -> PathBuf {
        self.dir.join(format!("shard-{}.safetensors", shard.0))
    }

    /// Write `state` as `shard`'s checkpoint, replacing the last one atomically.
    pub fn write(&self, shard: ShardId, state: &ShardState) -> Result<(), ActorError> {
        let path = self.path(shard);
        let error = |message: String| ActorError::Checkpoint { path: path.clone(), message };
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let (values, velocity) = (bytes(&state.values), bytes(&state.velocity));
        let mut views = vec![("values", view(&values, state.values.len()).map_err(&error)?)];
        if !state.velocity.is_empty() {
            views.push(("velocity", view(&velocity, state.velocity.len()).map_err(&error)?));
        }
        let pushed: Vec<String> = (state.last_pushed.iter())
            .map(|(l, w)| match w.below {
                0 => format!("{}:{}", l.0, w.newest),
                bits => format!("{}:{}/{bits}", l.0, w.newest),
            })
            .collect();
        let mut metadata = BTreeMap::from([
            ("shard".to_owned(), shard.0.to_string()),
            ("job".to_owned(), self.job.clone()),
            ("clock".to_owned(), state.clock.0.to_string()),
            ("received".to_owned(), state.received.to_string()),
            ("last_pushed".to_owned(), pushed.join(",")),
        ]);
        let sum = checksum(&[&values, &velocity], &metadata);
        metadata.insert("checksum".to_owned(), sum);
        let metadata: HashMap<String, String> = metadata.into_iter().collect();
        let file = safetensors::tensor::serialize(views, Some(metadata)).map_err(|e| error(e.to_string()))?;
        std::fs::create_dir_all(&self.dir).map_err(|e| error(format!("cannot create the directory: {e}")))?;
        let tmp = path.with_extension("safetensors.tmp");
        let written = std::fs::File::create(&tmp).and_then(|mut f| {
            f.write_all(&file)?;
            f.sync_all()
        });
        if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, &path)) {
            // A full disk keeps the last checkpoint, and no half-written file beside it.
            let _ = std::fs::remove_file(&tmp);
            return Err(error(format!("cannot write: {e}")));
        }
        // The rename itself is durable once the directory is synced (not possible everywhere).
        if let Ok(dir) = std::fs::File::open(&self.dir) {
            let _ = dir.sync_all();
        }
        Ok(())
    }

    /// `shard`'s last checkpoint, or `None` if it has none yet. A file that is not a
    /// checkpoint of this shard is an error naming it.
    pub fn read(&self, shard: ShardId) -> Result<Option<ShardState>, ActorError> {
        let path = self.path(shard);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ActorError::Checkpoint { path, message: format!("cannot read: {e}") }),
        };
        parse(&bytes, shard, self).map(Some).map_err(|message| ActorError::Checkpoint { path, message })
    }
}

fn view(bytes: &[u8], len: usize) -> Result<TensorView<'_>, String> {
    TensorView::new(Dtype::F32, vec![len], bytes).map_err(|e| e.to_string())
}

fn parse(bytes: &[u8], shard: ShardId, expected: &Checkpoints) -> Result<ShardState, String> {
    let not_one = |e: safetensors::SafeTensorError| format!("is not a shard checkpoint: {e}");
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(not_one)?;
    let tensors = SafeTensors::deserialize(bytes).map_err(not_one)?;
    let meta: BTreeMap<String, String> = header.metadata().clone().unwrap_or_default().into_iter().collect();
    let number = |key: &str| -> Result<u64, String> {
        let value = meta.get(key).ok_or_else(|| format!("has no `{key}` metadata"))?;
        value.parse().map_err(|_| format!("`{key}` is {value:?}, not a number"))
    };
    let saved = number("shard")?;
    if saved != u64::from(shard.0) {
        return Err(format!("is the checkpoint of shard-{saved}, not of {shard}"));
    }
    let job = meta.get("job").map_or("", String::as_str);
    if job != expected.job {
        return Err(format!(
            "belongs to another run (job {job:?}, this run is {:?}); remove it, or give this shard another checkpoint directory",
            expected.job
        ));
    }
    let data = |name: &str| tensors.tensor(name).map(|t| t.data().to_vec()).unwrap_or_default();
    let stored = meta.get("checksum").map_or("", String::as_str);
    if stored != checksum(&[&data("values"), &data("velocity")], &meta) {
        return Err("is damaged: its checksum does not match its contents".into());
    }
    let floats = |name: &str| -> Result<Vec<f32>, String> {
        let Ok(t) = tensors.tensor(name) else { return Ok(Vec::new()) };
        if t.dtype() != Dtype::F32 || t.shape().len() != 1 {
            return Err(format!("tensor `{name}` is {:?} {:?}, not F32 [len]", t.dtype(), t.shape()));
        }
        Ok(t.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
    };
    let last_pushed = meta
        .get("last_pushed")
        .map(String::as_str)
        .unwrap_or_default()
        .split(',')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let window = |w: &str| -> Option<PushWindow> {
                let (newest, below) = w.split_once('/').unwrap_or((w, "0"));
                Some(PushWindow { newest: newest.parse().ok()?, below: below.parse().ok()? })
            };
            let parsed =
                pair.split_once(':').and_then(|(l, w)| Some((LearnerId(l.parse().ok()?), window(w)?)));
            parsed.ok_or_else(|| format!("`last_pushed` has {pair:?}, not learner:seq or learner:seq/bits"))
        })
        .collect::<Result<_, _>>()?;
    let values = floats("values")?;
    if values.is_empty() {
        return Err("has no `values` tensor".into());
    }
    let velocity = floats("velocity")?;
    if !(rudra_compute::cpu::all_finite(&values) && rudra_compute::cpu::all_finite(&velocity)) {
        return Err("holds NaN or ±Inf values; a shard never keeps them".into());
    }
    let last_pushed: BTreeMap<LearnerId, PushWindow> = last_pushed;
    if let Some(l) = last_pushed.keys().find(|l| l.0 >= expected.learners) {
        return Err(format!("names {l}, but the run has {} learners", expected.learners));
    }
    Ok(ShardState {
        clock: Clock(number("clock")?),
        values,
        velocity,
        received: number("received")?,
        last_pushed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> ShardState {
        ShardState {
            clock: Clock(812),
            values: vec![1.5, -2.0, 3.25],
            velocity: vec![0.5, 0.0, -0.5],
            received: 3250,
            last_pushed: BTreeMap::from([
                (LearnerId(0), PushWindow { newest: 17, below: 0b101 }),
                (LearnerId(3), PushWindow { newest: 1 << 40, below: 0 }),
            ]),
        }
    }

    fn checkpoints(dir: &std::path::Path) -> Checkpoints {
        Checkpoints { dir: dir.to_owned(), every_updates: 10, job: "job-a".into(), learners: 4 }
    }

    #[test]
    fn a_damaged_nan_foreign_or_other_jobs_checkpoint_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let c = checkpoints(dir.path());
        let path = c.path(ShardId(0));
        let refused = |what: &str, expect: &str| {
            let e = c.read(ShardId(0)).unwrap_err().to_string();
            assert!(e.contains("shard-0.safetensors") && e.contains(expect), "{what}: {e}");
        };
        c.write(ShardId(0), &state()).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40; // a data byte of the last tensor
        std::fs::write(&path, &bytes).unwrap();
        refused("a flipped data byte", "checksum");
        c.write(ShardId(0), &ShardState { values: vec![1.0, f32::NAN, 3.0], ..state() }).unwrap();
        refused("a NaN value", "NaN");
        let mut stray = state();
        stray.last_pushed.insert(LearnerId(99), PushWindow { newest: 3, below: 0 });
        c.write(ShardId(0), &stray).unwrap();
        refused("an unknown learner", "learner-99");
        c.write(ShardId(0), &state()).unwrap();
        let other = Checkpoints { job: "job-b".into(), ..c.clone() };
        let e = other.read(ShardId(0)).unwrap_err().to_string();
        assert!(e.contains("another run") && e.contains("job-a"), "{e}");
        assert_eq!(c.read(ShardId(0)).unwrap(), Some(state()), "the whole checkpoint is read back");
    }

    #[test]
    fn a_checkpoint_reads_back_as_written_and_replaces_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let c = checkpoints(&dir.path().join("ck"));
        assert_eq!(c.read(ShardId(1)).unwrap(), None);
        c.write(ShardId(1), &ShardState { clock: Clock(1), values: vec![0.0; 3], ..ShardState::default() })
            .unwrap();
        c.write(ShardId(1), &state()).unwrap();
        assert_eq!(c.read(ShardId(1)).unwrap(), Some(state()));
        let names: Vec<_> = std::fs::read_dir(&c.dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["shard-1.safetensors"], "no temporary file is left behind");
    }

    #[test]
    fn a_file_that_is_not_this_shards_checkpoint_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let c = checkpoints(dir.path());
        c.write(ShardId(0), &state()).unwrap();
        std::fs::copy(c.path(ShardId(0)), c.path(ShardId(1))).unwrap();
        let e = c.read(ShardId(1)).unwrap_err().to_string();
        assert!(e.contains("shard-1.safetensors") && e.contains("checkpoint of shard-0"), "{e}");
        std::fs::write(c.path(ShardId(0)), b"not a checkpoint").unwrap();
        let e = c.read(ShardId(0)).unwrap_err().to_string();
        assert!(e.contains("is not a shard checkpoint"), "{e}");
    }
}
