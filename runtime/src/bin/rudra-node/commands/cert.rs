//! `rudra-node cert`: the cluster's CA, node certificates, join tokens and their Secrets.
//!
//! Every failure here is permanent (a missing or unreadable CA, a bad name, a file that cannot
//! be written): running the same command again fails the same way, so it exits 2.

use rudra_runtime::{RuntimeError, secret};
use rudra_transport::tls::CertDir;

use crate::cli::CertAction;

/// Carry out `action`.
pub(crate) fn run(action: CertAction) -> Result<(), RuntimeError> {
    act(action).map_err(|e| match e {
        RuntimeError::Transport(e) => RuntimeError::Certificates(e.to_string()),
        RuntimeError::Io { path, source } => {
            RuntimeError::Certificates(format!("{}: {source}", path.display()))
        }
        other => other,
    })
}

fn act(action: CertAction) -> Result<(), RuntimeError> {
    match action {
        CertAction::Init { dir } => {
            CertDir::new(&dir).init()?;
            println!("created the cluster CA in {}", dir.display());
        }
        CertAction::Issue { dir, name } => {
            CertDir::new(&dir).issue(&name)?;
            println!("issued {}", dir.join(format!("{name}.pem")).display());
        }
        CertAction::Token { dir, role, ttl, uses } => {
            let token = CertDir::new(&dir).authority()?.tokens().mint(role.into(), ttl.into(), uses)?;
            println!("{token}");
        }
        CertAction::Secret { dir, ttl, uses, name, namespace, out } => {
            let manifest =
                secret::manifest(&CertDir::new(&dir), ttl.into(), uses, &name, namespace.as_deref())?;
            match out {
                Some(path) => {
                    std::fs::write(&path, manifest).map_err(|source| RuntimeError::Io { path, source })?
                }
                None => print!("{manifest}"),
            }
        }
    }
    Ok(())
}
