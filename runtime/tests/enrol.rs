//! Enrolment with join tokens, across real processes: a scheduler holding the cluster CA, a
//! shard and two learners that start with nothing but the CA certificate and a token (one
//! named by its Indexed-Job ordinal, one by the scheduler), and nodes the scheduler refuses
//! while the run goes on: an expired token, a token for another role, a replayed token, a
//! token of another CA, and no token at all.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn node(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rudra-node"));
    c.args(args).current_dir(dir).env("RUST_LOG", "warn").env_remove("HOSTNAME").stdin(Stdio::null());
    c
}

fn stdout(mut c: Command) -> String {
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn token(dir: &Path, ca: &str, role: &str, ttl: &str, uses: &str) -> String {
    stdout(node(dir, &["cert", "token", "--dir", ca, "--role", role, "--ttl", ttl, "--uses", uses]))
}

/// A shard or learner in its own directory `dir/name`, enrolling with `token` (if any).
fn enrolling(dir: &Path, name: &str, role: &str, token: Option<&str>, addr: &str) -> Command {
    let home = dir.join(name);
    std::fs::create_dir_all(&home).unwrap();
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist");
    let mut c = node(&home, &[]);
    c.env("RUDRA_ROLE", role)
        .env("RUDRA_SCHEDULER", addr)
        .env("RUDRA_CA", dir.join("ca/ca.pem"))
        .env("RUDRA_CONNECT_TIMEOUT", "60s")
        .env("RUDRA__TRAINING__DATA_DIR", data);
    if let Some(t) = token {
        c.env("RUDRA_TOKEN", t);
    }
    c
}

/// A scheduler with the cluster CA in `dir/ca`, listening on `listen`, writing `dir/run`: a
/// run of one epoch with one shard, changed by `settings`.
fn scheduler(dir: &Path, listen: &str, settings: &[&str]) -> Command {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist");
    let data = format!("training.data_dir={}", data.display());
    let mut args = vec!["--role", "scheduler", "--certs", "ca", "--listen", listen, "--out", "run"];
    for set in ["cluster.shards=1", "training.epochs=1", &data].iter().chain(settings) {
        args.extend(["--set", set]);
    }
    node(dir, &args)
}

fn refused(c: Command, why: &str) -> Output {
    let mut c = c;
    let out = c.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "exit code 2 (do not restart) for {why}: {err}");
    assert!(err.contains(why), "{why:?} not in:\n{err}");
    out
}

fn wait(name: &str, child: &mut Child, limit: Duration) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{name} exited with {status}");
            return;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("{name} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn nodes_enrol_with_join_tokens_and_bad_tokens_are_refused_while_the_run_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    stdout(node(dir, &["cert", "init", "--dir", "ca"]));
    stdout(node(dir, &["cert", "init", "--dir", "other-ca"]));
    let shard_token = token(dir, "ca", "shard", "1h", "1");
    let learner_token = token(dir, "ca", "learner", "1h", "2");
    let expired = token(dir, "ca", "learner", "0s", "1");
    let foreign = token(dir, "other-ca", "learner", "1h", "1");
    let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("localhost:{port}");
    let listen = format!("127.0.0.1:{port}");

    let settings = ["cluster.learners=2", "protocol.n=2", "training.train_examples=8000"];
    let scheduler =
        scheduler(dir, &listen, &settings).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();

    // Before the run: the shard's token, replayed by a second shard.
    let mut shard =
        enrolling(dir, "shard", "shard", Some(&shard_token), &addr).stdout(Stdio::null()).spawn().unwrap();
    let mut indexed = enrolling(dir, "indexed", "learner", Some(&learner_token), &addr);
    let mut indexed = indexed.env("JOB_COMPLETION_INDEX", "1").stdout(Stdio::null()).spawn().unwrap();
    // Wait until the shard has its certificate, so the replay comes second.
    let start = Instant::now();
    while !dir.join("shard/certs/shard-0.pem").exists() {
        assert!(start.elapsed() < Duration::from_secs(60), "the shard never enrolled");
        std::thread::sleep(Duration::from_millis(50));
    }
    refused(enrolling(dir, "replay", "shard", Some(&shard_token), &addr), "replayed");
    // The expired token was minted with no time to live: a second on, it is past.
    std::thread::sleep(Duration::from_millis(1100));
    refused(enrolling(dir, "expired", "learner", Some(&expired), &addr), "expired");
    refused(enrolling(dir, "wrong-role", "learner", Some(&shard_token), &addr), "admits a shard");
    refused(enrolling(dir, "foreign", "learner", Some(&foreign), &addr), "unknown token");
    refused(enrolling(dir, "no-token", "learner", None, &addr), "--token");
    let mut assigned = enrolling(dir, "assigned", "learner", Some(&learner_token), &addr)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let limit = Duration::from_secs(240);
    wait("the shard", &mut shard, limit);
    wait("the indexed learner", &mut indexed, limit);
    wait("the assigned learner", &mut assigned, limit);
    let out = scheduler.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the scheduler: {log}");

    // The indexed learner took its ordinal; the other was given the first free name.
    assert!(dir.join("indexed/certs/learner-1.pem").exists());
    assert!(dir.join("assigned/certs/learner-0.pem").exists());
    assert_eq!(std::fs::read_to_string(dir.join("assigned/certs/learner.name")).unwrap(), "learner-0");
    // Every refusal is logged with its reason; three enrolments are on record.
    for why in ["replayed", "expired", "admits a shard", "unknown token"] {
        assert!(log.lines().any(|l| l.contains("refused enrolment") && l.contains(why)), "{why}: {log}");
    }
    let ledger = std::fs::read_to_string(dir.join("run/enrolments.log")).unwrap();
    let names: Vec<&str> = ledger.lines().filter_map(|l| l.split_whitespace().nth(1)).collect();
    assert_eq!(names.len(), 3, "{ledger}");
    for name in ["shard-0", "learner-0", "learner-1"] {
        assert!(names.contains(&name), "{name}: {ledger}");
    }
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run/summary.json")).unwrap()).unwrap();
    assert_eq!(summary["learners"], 2);
    assert!(summary["final_test_accuracy"].as_f64().unwrap() > 0.8, "{summary}");

    // A node restarted with its certificate kept needs no token: the replay is only of tokens.
    let again = enrolling(dir, "shard", "shard", None, &format!("127.0.0.1:{}", free_port()))
        .env("RUDRA_CONNECT_TIMEOUT", "1s")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(!err.contains("--token") && err.contains("gave up reaching"), "{err}");
}

fn free_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Slow and silent clients hold connections to the enrolment port: 200 that never start their
/// TLS handshake, and 32 that trickle a byte a second (connecting again when cut off). A shard
/// and a learner with valid tokens still enrol within 5 s each, the run finishes, and the
/// scheduler exits within 2 s of the run's end whatever is still connected.
#[test]
fn slow_and_silent_clients_cannot_hold_the_enrolment_port() {
    use std::io::Write as _;
    use std::net::TcpStream;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    stdout(node(dir, &["cert", "init", "--dir", "ca"]));
    let shard_token = token(dir, "ca", "shard", "1h", "1");
    let learner_token = token(dir, "ca", "learner", "1h", "1");
    let port = free_port();
    let (addr, listen) = (format!("localhost:{port}"), format!("127.0.0.1:{port}"));
    let settings = ["cluster.learners=1", "protocol.kind=async", "training.train_examples=2000"];
    let mut scheduler =
        scheduler(dir, &listen, &settings).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let start = Instant::now();
    while TcpStream::connect(&listen).is_err() {
        assert!(start.elapsed() < Duration::from_secs(30), "the enrolment port never opened");
        std::thread::sleep(Duration::from_millis(50));
    }
    let silent: Vec<TcpStream> = (0..200).filter_map(|_| TcpStream::connect(&listen).ok()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let tricklers: Vec<_> = (0..32)
        .map(|_| {
            let (stop, listen) = (Arc::clone(&stop), listen.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut s) = TcpStream::connect(&listen) else { continue };
                    // A TLS record header, one byte at a time, a second apart.
                    for b in [0x16u8, 0x03, 0x01, 0x02, 0x00].iter().cycle() {
                        if stop.load(Ordering::Relaxed) || s.write_all(&[*b]).is_err() {
                            break;
                        }
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));

    let mut nodes = Vec::new();
    for (role, token, cert) in [
        ("shard", &shard_token, "shard/certs/shard-0.pem"),
        ("learner", &learner_token, "learner/certs/learner-0.pem"),
    ] {
        let started = Instant::now();
        nodes.push(
            enrolling(dir, role, role, Some(token), &addr)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        while !dir.join(cert).exists() {
            assert!(started.elapsed() < Duration::from_secs(5), "the {role} did not enrol within 5 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("the {role} enrolled in {:.2?} under load", started.elapsed());
    }
    let mut last_exit = Instant::now();
    for (name, mut child) in ["the shard", "the learner"].into_iter().zip(nodes) {
        wait(name, &mut child, Duration::from_secs(120));
        last_exit = Instant::now();
    }
    wait("the scheduler", &mut scheduler, Duration::from_secs(30));
    let after = last_exit.elapsed();
    stop.store(true, Ordering::Relaxed);
    drop(silent);
    for t in tricklers {
        t.join().unwrap();
    }
    assert!(dir.join("run/summary.json").exists(), "the run's results are written");
    eprintln!("the scheduler exited {after:.2?} after its last node, 232 clients still connected");
    assert!(after < Duration::from_secs(2), "the scheduler exited {after:.2?} after its last node");
}
