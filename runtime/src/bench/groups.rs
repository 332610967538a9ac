//! Learner groups across processes: the peers' workload with λ = 4 learners and one shard,
//! every node a `rudra-node` process over loopback QUIC, without groups, in 2 groups of an
//! aggregation tree and in 2 hierarchical groups (each group's aggregator a process of its
//! own), under hardsync and async; against the same processes without groups under the same
//! protocol, in the same run: samples/s, and the bytes into the shard per update, ⟨σ⟩ and the
//! final test accuracy of each.

use std::path::Path;

use super::cluster::{processes, workload};
use super::{BenchRow, interleaved, throughput_rows};
use crate::RuntimeError;
use crate::processes::{issue_certs, names};

/// The groups compared: (name, `cluster.groups`, `cluster.hierarchical`); the first is the
/// baseline.
const GROUPS: [(&str, u32, bool); 3] =
    [("no groups", 1, false), ("2 groups, aggregation tree", 2, false), ("2 hierarchical groups", 2, true)];

/// The learners and the shards.
const LEARNERS: u32 = 4;

/// Measure every kind of group under hardsync and async `repeats` times, interleaved.
pub fn run(file: Option<&Path>, base: &[String], repeats: usize) -> Result<Vec<BenchRow>, RuntimeError> {
    let tmp = tempfile::tempdir().map_err(|e| RuntimeError::Config(format!("groups benchmark: {e}")))?;
    let certs = tmp.path().join("certs");
    issue_certs(&certs, &names((1, LEARNERS, 2)))?;
    let mut rows = Vec::new();
    for kind in ["hardsync", "async"] {
        let measured = interleaved(GROUPS.len(), repeats, &tmp.path().join(kind), |i, dir| {
            let (name, groups, hierarchical) = GROUPS[i];
            let mut sets = workload(base, ("f32", "f32"), 0);
            sets.extend([
                format!("protocol.kind={kind}"),
                format!("cluster.learners={LEARNERS}"),
                format!("cluster.groups={groups}"),
                format!("cluster.hierarchical={hierarchical}"),
            ]);
            let s = processes((file, &sets), (1, LEARNERS, groups), (&certs, dir), None)?.summary;
            tracing::info!(
                "{kind}, {name}: {:.0} samples/s, ⟨σ⟩ {:.2}",
                s.samples_per_second,
                s.staleness.mean
            );
            Ok([s.samples_per_second, s.shard_payload_in_per_update, s.staleness.mean, s.final_test_accuracy])
        })?;
        let names = GROUPS.iter().map(|(name, ..)| format!("{kind}, {name}")).collect();
        let further = [
            ("bytes into the shard per update", "bytes"),
            ("mean staleness", "σ"),
            ("test accuracy", "fraction"),
        ];
        rows.extend(throughput_rows(names, measured, &format!("{kind}, no groups"), &further));
    }
    Ok(rows)
}
