//! `rudra-node cert secret`: the cluster CA and join tokens as Kubernetes Secret manifests.
//!
//! Two Secrets, so that only the scheduler sees the CA key: `NAME-ca` holds `ca.pem` and
//! `ca.key` (mounted by the scheduler as its `--certs`), `NAME-join` holds `ca.pem`,
//! `shard-token`, `learner-token` and `aggregator-token` (every other node: `--ca` and
//! `RUDRA_TOKEN`).

use std::time::Duration;

use rudra_transport::Role;
use rudra_transport::tls::CertDir;

use crate::RuntimeError;

/// `text` as a YAML block scalar under a key indented by `indent` spaces.
fn block(text: &str, indent: usize) -> String {
    let pad = " ".repeat(indent + 2);
    let mut out = String::from("|\n");
    for line in text.trim_end().lines() {
        out += &format!("{pad}{line}\n");
    }
    out
}

fn secret(name: &str, namespace: Option<&str>, entries: &[(&str, String)]) -> String {
    let mut out = format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n{}  labels:\n    app.kubernetes.io/name: rudra\ntype: Opaque\nstringData:\n",
        namespace.map(|ns| format!("  namespace: {ns}\n")).unwrap_or_default()
    );
    for (key, value) in entries {
        out += &format!("  {key}: {}", block(value, 2));
    }
    out
}

/// The manifests for the CA in `certs`, with a shard and a learner token valid for `ttl` and
/// `uses` enrolments each; Secrets named `NAME-ca` and `NAME-join` in `namespace`.
pub fn manifest(
    certs: &CertDir,
    ttl: Duration,
    uses: u32,
    name: &str,
    namespace: Option<&str>,
) -> Result<String, RuntimeError> {
    let authority = certs.authority()?;
    let ca_key = std::fs::read_to_string(certs.dir().join("ca.key"))
        .map_err(|e| RuntimeError::Config(format!("cannot read the CA key: {e}")))?;
    let ca = authority.ca_pem().to_owned();
    let shard = authority.tokens().mint(Role::Shard, ttl, uses)?;
    let learner = authority.tokens().mint(Role::Learner, ttl, uses)?;
    let aggregator = authority.tokens().mint(Role::Aggregator, ttl, uses)?;
    Ok(format!(
        "# The cluster CA (scheduler only) and join tokens (every node), from `rudra-node cert secret`.\n{}\n---\n{}",
        secret(&format!("{name}-ca"), namespace, &[("ca.pem", ca.clone()), ("ca.key", ca_key)]),
        secret(
            &format!("{name}-join"),
            namespace,
            &[
                ("ca.pem", ca),
                ("shard-token", shard),
                ("learner-token", learner),
                ("aggregator-token", aggregator)
            ]
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_secrets_hold_the_ca_and_tokens_that_the_ca_accepts() {
        let dir = tempfile::tempdir().unwrap();
        let certs = CertDir::new(dir.path());
        certs.init().unwrap();
        let yaml = manifest(&certs, Duration::from_secs(3600), 5, "rudra", Some("ml")).unwrap();
        let docs: Vec<&str> = yaml.split("\n---\n").collect();
        assert_eq!(docs.len(), 2);
        assert!(
            docs[0].contains("name: rudra-ca\n  namespace: ml\n")
                && docs[0].contains("  ca.key: |\n    -----BEGIN")
        );
        assert!(docs[1].contains("name: rudra-join\n") && !docs[1].contains("PRIVATE KEY"));
        let authority = certs.authority().unwrap();
        let tokens = [
            ("shard-token", Role::Shard),
            ("learner-token", Role::Learner),
            ("aggregator-token", Role::Aggregator),
        ];
        for (key, role) in tokens {
            let line = docs[1].lines().skip_while(|l| !l.starts_with(&format!("  {key}:"))).nth(1).unwrap();
            let token = authority.tokens().check(line.trim(), role).unwrap();
            assert_eq!(token.uses, 5, "{key}");
        }
    }
}
