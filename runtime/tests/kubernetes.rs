//! The Kubernetes manifests of `deploy/kubernetes/`, rendered for λ = 16 and checked against the
//! Kubernetes API schemas, with the Secrets `rudra-node cert secret` writes
//! (`deploy/kubernetes/test.py`). Where the system's Python lacks kubernetes-validate it is
//! installed into a virtual environment under `target/`; the test never skips.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A Python that can import `kubernetes_validate` and `yaml`.
fn python() -> PathBuf {
    let can_import = |python: &Path| {
        Command::new(python)
            .args(["-c", "import kubernetes_validate, yaml"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let system = Path::new("python3");
    if can_import(system) {
        return system.to_owned();
    }
    let env = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kubernetes-venv");
    let python = env.join("bin").join("python");
    if !can_import(&python) {
        let _ = std::fs::remove_dir_all(&env);
        let run = |cmd: &mut Command| {
            let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?} cannot start ({e}); install Python 3"));
            assert!(o.status.success(), "{cmd:?} failed:\n{}", String::from_utf8_lossy(&o.stderr));
        };
        run(Command::new("python3").args(["-m", "venv"]).arg(&env));
        run(Command::new(&python).args(["-m", "pip", "install", "--quiet", "kubernetes-validate"]));
    }
    python
}

#[test]
fn manifests_for_sixteen_learners_pass_the_kubernetes_schemas() {
    let tmp = tempfile::tempdir().unwrap();
    let node = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_rudra-node"))
            .args(args)
            .current_dir(tmp.path())
            .output()
            .unwrap();
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    };
    node(&["cert", "init", "--dir", "certs"]);
    node(&["cert", "secret", "--dir", "certs", "--ttl", "2h", "--out", "secret.yaml"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes/test.py");
    let o = Command::new(python()).arg(&script).arg(tmp.path().join("secret.yaml")).output().unwrap();
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{} failed:\n{out}{err}", script.display());
    assert!(out.contains("for λ = 16") && out.contains("valid against Kubernetes"), "{out}");
}
