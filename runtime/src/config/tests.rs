//! Loading, layering and validating configurations.

use super::*;
use rudra_actors::BatchSizing;
use rudra_compute::ModelSpec;

fn load(set: &[&str]) -> Result<Config, RuntimeError> {
    Config::load(None, &set.iter().map(|s| s.to_string()).collect::<Vec<_>>())
}

/// `c`'s built-in network.
fn builtin(c: &Config) -> &ModelSpec {
    c.model.builtin("a test").unwrap()
}

/// The rule of `c`'s SGD protocol.
fn sgd_rule(c: &Config) -> SyncRule {
    match &c.cluster.protocol {
        ProtocolSpec::Sgd(s) => s.rule,
        ProtocolSpec::Elastic(e) => panic!("{:?} is not an SGD protocol", e.method),
    }
}

#[test]
fn defaults_are_the_shipped_default_config() {
    let c = load(&[]).unwrap();
    assert_eq!(c.cluster.learners, 4);
    assert_eq!(c.cluster.shards, 2);
    assert_eq!(sgd_rule(&c), SyncRule::Softsync { n: 4 });
    assert_eq!(c.cluster.protocol.modulation(), LrModulation::PerGradient);
    assert_eq!(builtin(&c).hidden, vec![256]);
    assert_eq!(c.cluster.batch_size, 32);
    assert_eq!(c.cluster.protocol.max_staleness(), None);
}

#[test]
fn a_global_batch_size_gives_each_learner_its_share() {
    let mu = |sets: &[&str]| load(sets).unwrap().cluster.batch_size;
    assert_eq!(mu(&["training.global_batch_size=128"]), 32, "128 / 4 learners");
    assert_eq!(mu(&["training.global_batch_size=128", "cluster.learners=30"]), 4, "rounded");
    assert_eq!(mu(&["training.global_batch_size=8", "cluster.learners=30"]), 1, "at least one");
    assert_eq!(mu(&["training.global_batch_size=0", "training.batch_size=7"]), 7, "0: batch_size");
}

#[test]
fn set_overrides_with_typed_values() {
    let c = load(&[
        "protocol.kind=hardsync",
        "training.hidden=[64, 32]",
        "training.learning_rate=0.05",
        "protocol.max_staleness=3",
        "protocol.lr_modulation=mean",
    ])
    .unwrap();
    assert_eq!(sgd_rule(&c), SyncRule::Hardsync);
    assert_eq!(builtin(&c).hidden, vec![64, 32]);
    assert_eq!(c.cluster.schedule.base, 0.05);
    assert_eq!(c.cluster.protocol.max_staleness(), Some(3));
    assert_eq!(c.cluster.protocol.modulation(), LrModulation::Mean);
    let a = load(&["protocol.kind=async", "cluster.learners=6"]).unwrap();
    assert_eq!(sgd_rule(&a), SyncRule::Async);
    assert_eq!((a.protocol_name(), a.sync_n()), ("async", 6));
    let twice = load(&["training.epochs=1", "training.epochs=3"]).unwrap();
    assert_eq!(twice.cluster.epochs, 3, "the last --set of a key wins");
}

#[test]
fn elastic_protocols_take_the_papers_defaults() {
    let e =
        |set: &[&str]| load(set).unwrap().cluster.protocol.elastic().cloned().expect("an elastic protocol");
    let easgd = e(&["protocol.kind=easgd", "cluster.learners=6"]);
    assert_eq!(easgd.method, ElasticMethod::Easgd { sync: false });
    assert_eq!((easgd.tau, easgd.beta), (10, 0.9));
    assert!((easgd.alpha - 0.9 / 6.0).abs() < 1e-7, "α = β / λ");
    let sync = e(&["protocol.kind=easgd", "protocol.sync=true", "protocol.alpha=0.25", "protocol.beta=1"]);
    assert_eq!((sync.method, sync.alpha, sync.beta), (ElasticMethod::Easgd { sync: true }, 0.25, 1.0));
    assert_eq!(e(&["protocol.kind=eamsgd"]).momentum, 0.99);
    assert_eq!(e(&["protocol.kind=downpour"]).tau, 1);
    let gamma = e(&["protocol.kind=mdownpour", "training.lr_decay_gamma=0.5"]);
    assert_eq!((gamma.method, gamma.lr_decay_gamma), (ElasticMethod::MDownpour, 0.5));
    assert_eq!(load(&[]).unwrap().cluster.protocol.elastic().cloned(), None);
    let d = e(&["protocol.kind=diloco"]);
    assert_eq!(
        (d.method, d.tau, d.outer_lr, d.outer_momentum),
        (ElasticMethod::Diloco { sync: true }, 10, 0.7, 0.9)
    );
    assert_eq!(
        e(&["protocol.kind=diloco", "protocol.sync=false"]).method,
        ElasticMethod::Diloco { sync: false }
    );
    assert_eq!(load(&["protocol.kind=diloco"]).unwrap().cluster.schedule.base, 0.05);
}

#[test]
fn local_optimizers_are_for_learners_that_step_on_their_own() {
    let optimizer = |set: &[&str]| load(set).unwrap().cluster.protocol.elastic().cloned().unwrap().optimizer;
    let adamw = OptimizerSpec::AdamW { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 };
    assert_eq!(optimizer(&["protocol.kind=diloco", "training.optimizer=adamw"]), adamw);
    assert_eq!(
        optimizer(&["protocol.kind=downpour", "training.optimizer=momentum", "training.momentum=0.5"]),
        OptimizerSpec::Momentum { momentum: 0.5 }
    );
    assert_eq!(optimizer(&["protocol.kind=easgd"]), OptimizerSpec::Sgd);
    assert_eq!(key_of(&["training.optimizer=adamw"]), "training.optimizer", "softsync steps at the shards");
    assert_eq!(key_of(&["protocol.kind=eamsgd", "training.optimizer=momentum"]), "training.optimizer");
    assert_eq!(key_of(&["protocol.kind=diloco", "training.optimizer=adam"]), "training.optimizer");
    assert_eq!(key_of(&["training.beta1=1"]), "training.beta1", "whatever the protocol");
    assert_eq!(key_of(&["training.eps=0"]), "training.eps");
    assert_eq!(key_of(&["training.weight_decay=-1"]), "training.weight_decay");
}

#[test]
fn diloco_outer_settings_are_checked_naming_the_key() {
    assert_eq!(key_of(&["protocol.kind=diloco", "protocol.outer_lr=0"]), "protocol.outer_lr");
    assert_eq!(key_of(&["protocol.outer_lr=-1"]), "protocol.outer_lr", "whatever the protocol");
    assert_eq!(key_of(&["protocol.kind=diloco", "protocol.outer_momentum=1"]), "protocol.outer_momentum");
}

/// The key an invalid configuration's error names (or its message).
fn key_of(set: &[&str]) -> String {
    match load(set) {
        Err(RuntimeError::Invalid(InvalidSetting { key, .. })) => key.to_string(),
        Err(RuntimeError::Config(m)) => m,
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn models_datasets_and_devices() {
    let c = load(&["training.model=cnn", "compute.device=wgpu"]).unwrap();
    assert_eq!(*builtin(&c), ModelSpec::cnn());
    assert_eq!(c.device, DeviceKind::Wgpu);
    assert_eq!(c.data.dir, PathBuf::from("data/mnist"));
    let f = load(&["training.dataset=fashion-mnist", "training.model=cnn"]).unwrap();
    assert_eq!(
        (f.data.kind, f.data.dir),
        (DatasetKind::FashionMnist, "/usr/share/datasets/fashion-mnist".into())
    );
    let cifar = ["training.dataset=cifar10", "training.data_dir=/data/cifar"];
    assert_eq!(builtin(&load(&cifar).unwrap()).inputs, 3072, "an mlp on colour images");
    let net = load(&[cifar[0], cifar[1], "training.model=cifar10-net"]).unwrap();
    assert_eq!(net.model.param_count(), 89_578);
    assert_eq!(key_of(&["training.dataset=cifar10"]), "training.data_dir", "cifar10 has no default");
    assert_eq!(key_of(&[cifar[0], cifar[1], "training.model=cnn"]), "training.model");
    assert_eq!(key_of(&["training.model=cifar10-net"]), "training.model");
    assert_eq!(key_of(&["training.dataset=imagenet"]), "training.dataset");
}

#[test]
fn cifar10_is_read_from_its_binary_files() {
    let dir = tempfile::tempdir().unwrap();
    let names =
        ["data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin"];
    for (i, name) in names.iter().chain(&["test_batch.bin"]).enumerate() {
        // Two records: label, then 3072 pixel bytes.
        let bytes: Vec<u8> = (0..2).flat_map(|r| std::iter::once((i + r) as u8).chain([128; 3072])).collect();
        std::fs::write(dir.path().join(name), bytes).unwrap();
    }
    let set = format!("training.data_dir={}", dir.path().display());
    let c = load(&["training.dataset=cifar10", &set, "training.model=cifar10-net"]).unwrap();
    let data = c.data.load().unwrap();
    assert_eq!((data.train.len(), data.test.len(), data.test.features()), (10, 2, 3072));
    std::fs::write(dir.path().join("test_batch.bin"), [0u8; 100]).unwrap();
    let err = c.data.load().unwrap_err().to_string();
    assert!(err.contains("test_batch.bin") && err.contains("3073-byte"), "{err}");
}

#[test]
#[ignore = "needs the Debian package dataset-fashion-mnist (CI installs it)"]
fn fashion_mnist_is_read_from_the_debian_package() {
    let c = load(&["training.dataset=fashion-mnist"]).unwrap();
    let data = c.data.load().unwrap();
    assert_eq!((data.train.len(), data.test.len()), (60_000, 10_000));
    let (mut x, mut y) = (Vec::new(), Vec::new());
    data.test.gather(&(0..10_000).collect::<Vec<u32>>(), &mut x, &mut y);
    assert!((0..10).all(|class| y.iter().filter(|&&l| l == class).count() == 1000));
    let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / x.len() as f64 * 255.0;
    assert!((mean - 73.1).abs() < 1.0, "mean test pixel {mean}");
}

#[test]
fn bad_values_name_their_key() {
    assert_eq!(key_of(&["protocol.kind=paxos"]), "protocol.kind");
    for (set, key) in [
        ("protocol.tau=0", "protocol.tau"),
        ("protocol.alpha=0", "protocol.alpha"),
        ("protocol.alpha=-1", "protocol.alpha"),
        ("protocol.alpha=nan", "protocol.alpha"),
        ("protocol.beta=0", "protocol.beta"),
        ("protocol.beta=inf", "protocol.beta"),
        ("protocol.momentum=1", "protocol.momentum"),
        ("training.lr_decay_gamma=-1", "training.lr_decay_gamma"),
    ] {
        let got = match load(&["protocol.kind=easgd", set]) {
            Err(RuntimeError::Invalid(InvalidSetting { key, .. })) => key,
            other => panic!("{set}: expected an error naming {key}, got {other:?}"),
        };
        assert_eq!(got, key, "{set}");
    }
    assert!(load(&["protocol.kind=mdownpour", "protocol.tau=2"]).is_err(), "MDOWNPOUR has τ = 1");
    let wide = load(&["protocol.kind=easgd", "protocol.alpha=1.5", "protocol.beta=1.95"]).unwrap();
    let e = wide.cluster.protocol.elastic().cloned().unwrap();
    assert_eq!((e.alpha, e.beta), (1.5, 1.95), "α and β above 1 are points of the stability analysis");
    assert_eq!(key_of(&["training.target_accuracy=1.5"]), "training.target_accuracy");
    assert_eq!(key_of(&["protocol.lr_modulation=cubic"]), "protocol.lr_modulation");
    assert_eq!(key_of(&["training.model=resnet"]), "training.model");
    assert_eq!(key_of(&["compute.device=tpu"]), "compute.device");
    assert!(key_of(&["training.batch_size=-3"]).contains("batch_size"));
    assert!(key_of(&["training.bogus=1"]).contains("bogus"));
    assert!(key_of(&["nonsense"]).contains("section.key=value"));
}

#[test]
fn streaming_fragments_are_diloco_runs_of_whole_shards_dividing_tau() {
    let refusal = |sets: &[&str]| {
        let c = load(&[&["protocol.kind=diloco", "cluster.shards=4", "protocol.tau=12"], sets].concat())?;
        c.cluster.validate_settings(c.model.param_count()).map_err(RuntimeError::Invalid)
    };
    assert!(refusal(&["protocol.fragments=4"]).is_ok());
    assert_eq!(
        load(&["protocol.fragments=4"]).unwrap().cluster.protocol.elastic().cloned(),
        None,
        "not read by softsync"
    );
    for (sets, why) in [
        (&["protocol.fragments=0"][..], "at least 1"),
        (&["protocol.fragments=4", "protocol.kind=downpour"], "belong to diloco"),
        (&["protocol.fragments=4", "protocol.tau=10"], "divide protocol.tau"),
        (&["protocol.fragments=3"], "divide cluster.shards"),
    ] {
        match refusal(sets) {
            Err(RuntimeError::Invalid(InvalidSetting { key, message })) => {
                assert_eq!(key, "protocol.fragments", "{sets:?}");
                assert!(message.contains(why), "{sets:?}: {message}");
            }
            other => panic!("{sets:?}: expected a refusal, got {other:?}"),
        }
    }
}

#[test]
fn missing_file_and_missing_dataset_are_clear() {
    assert!(matches!(Config::load(Some(Path::new("/no/such.toml")), &[]), Err(RuntimeError::Config(_))));
    let c = load(&["training.data_dir=/no/such/dir"]).unwrap();
    assert!(matches!(
        c.data.load(),
        Err(RuntimeError::Invalid(InvalidSetting { key: "training.data_dir", .. }))
    ));
}

#[test]
fn an_external_model_reads_its_init_file_and_pairs_with_an_external_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("init.safetensors");
    let bytes: Vec<u8> = [0.5f32; 6].iter().flat_map(|v| v.to_le_bytes()).collect();
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2, 3], &bytes).unwrap();
    std::fs::write(&path, safetensors::tensor::serialize([("w", view)], None).unwrap()).unwrap();
    let init = format!("training.init={}", path.display());
    let external =
        ["training.model=external", "training.dataset=external", "training.train_examples=100", &init];
    let c = load(&external).unwrap();
    assert_eq!(c.model.param_count(), 6);
    assert_eq!(c.models(Device::Cpu(rudra_compute::CpuBackend)).init().as_slice(), &[0.5; 6]);
    let data = c.data.load().unwrap();
    assert!(data.train.is_external() && data.train.len() == 100);
    // Each of the four settings is needed, and init belongs to an external model alone.
    assert_eq!(key_of(&external[1..]), "training.model");
    assert_eq!(key_of(&[external[0], external[2], &init]), "training.model");
    assert_eq!(key_of(&external[..3]), "training.init");
    assert_eq!(key_of(&[external[0], external[1], &init]), "training.train_examples");
    assert_eq!(key_of(&[&init]), "training.init");
    let missing = [
        "training.model=external",
        "training.dataset=external",
        "training.train_examples=9",
        "training.init=nowhere.safetensors",
    ];
    assert!(load(&missing).unwrap_err().to_string().contains("nowhere.safetensors"));
}

#[test]
fn topk_keeps_its_fraction_of_each_block_of_gradients_only() {
    let c = load(&["transport.gradient_codec=topk", "transport.topk_fraction=0.05"]).unwrap();
    let g = c.cluster.codecs.gradients;
    assert_eq!((g.codec, g.block, g.keep), (rudra_transport::Codec::TopK, 256, 13), "⌈0.05 · 256⌉");
    let tiny = load(&["transport.gradient_codec=topk", "transport.topk_fraction=1e-9"]).unwrap();
    assert_eq!(tiny.cluster.codecs.gradients.keep, 1, "at least one value of each block");
    let refused = |sets: &[&str], key: &str| {
        let e = load(sets).unwrap_err().to_string();
        assert!(e.contains(key), "{sets:?}: {e}");
    };
    refused(&["transport.weight_codec=topk"], "transport.weight_codec");
    refused(&["transport.topk_fraction=0"], "transport.topk_fraction");
    refused(&["transport.topk_fraction=1.5"], "transport.topk_fraction");
    refused(&["transport.topk_fraction=nan"], "transport.topk_fraction");
    refused(&["transport.gradient_codec=topk", "transport.codec_block=100000"], "transport.codec_block");
    assert!(load(&["transport.gradient_codec=int8", "transport.codec_block=100000"]).is_ok());
}

#[test]
fn prefetch_is_for_softsync_and_async_and_at_most_eight() {
    let prefetch = |c: &Config| match &c.cluster.protocol {
        ProtocolSpec::Sgd(s) => s.prefetch,
        ProtocolSpec::Elastic(_) => unreachable!("an SGD protocol"),
    };
    assert_eq!(prefetch(&load(&[]).unwrap()), 0, "off by default");
    assert_eq!(prefetch(&load(&["protocol.kind=async", "protocol.prefetch=2"]).unwrap()), 2);
    let refused = |sets: &[&str], want: &str| {
        let e = load(sets).unwrap_err().to_string();
        assert!(e.contains("protocol.prefetch") && e.contains(want), "{sets:?}: {e}");
    };
    refused(&["protocol.kind=hardsync", "protocol.prefetch=1"], "hardsync");
    refused(&["protocol.kind=easgd", "protocol.prefetch=1"], "τ");
    refused(&["protocol.kind=async", "protocol.prefetch=9"], "at most 8");
}

#[test]
fn a_quorum_is_for_rounds_that_wait_for_all_on_one_shard_within_lambda_without_backups() {
    let quorum = |c: &Config| c.cluster.protocol.quorum().copied();
    assert_eq!(quorum(&load(&["protocol.kind=hardsync"]).unwrap()), None, "off by default");
    let q =
        quorum(&load(&["protocol.kind=hardsync", "protocol.quorum=3", "cluster.shards=1"]).unwrap()).unwrap();
    assert_eq!((q.size, q.late, q.grace_max_ms), (3, rudra_proto::LateRule::Fold, 50), "fold, 50 ms");
    let q = load(&[
        "protocol.kind=hardsync",
        "cluster.shards=1",
        "protocol.quorum=2",
        "protocol.late=\"drop\"",
        "protocol.grace_max_ms=5",
    ]);
    assert_eq!(quorum(&q.unwrap()).map(|q| (q.late, q.grace_max_ms)), Some((rudra_proto::LateRule::Drop, 5)));
    let refused = |sets: &[&str], key: &str, want: &str| {
        let e = load(sets).unwrap_err().to_string();
        assert!(e.contains(key) && e.contains(want), "{sets:?}: {e}");
    };
    for kind in ["protocol.kind=diloco", "protocol.kind=easgd"] {
        let q = load(&[kind, "protocol.sync=true", "protocol.quorum=2", "cluster.shards=1"]).unwrap();
        assert_eq!(quorum(&q).map(|q| q.size), Some(2), "{kind}: sync rounds");
        refused(&[kind, "protocol.sync=false", "protocol.quorum=2"], "protocol.quorum", "never wait for all");
    }
    refused(&["protocol.kind=async", "protocol.quorum=2"], "protocol.quorum", "never wait for all");
    refused(&["protocol.kind=hardsync", "protocol.quorum=5"], "protocol.quorum", "λ = 4");
    refused(
        &["protocol.kind=hardsync", "protocol.quorum=3", "cluster.shards=2"],
        "protocol.quorum",
        "one shard",
    );
    refused(
        &["protocol.kind=hardsync", "protocol.quorum=3", "cluster.shards=1", "protocol.backups=1"],
        "protocol.quorum",
        "one of the two",
    );
    refused(
        &["protocol.kind=hardsync", "protocol.quorum=3", "cluster.shards=1", "protocol.grace_max_ms=60001"],
        "grace_max_ms",
        "at most",
    );
    refused(&["protocol.kind=hardsync", "protocol.late=\"later\""], "protocol.late", "fold, drop");
}

#[test]
fn adaptive_batch_sizes_are_for_the_sgd_rules() {
    let sizing = |sets: &[&str]| load(sets).map(|c| c.cluster.batch_sizing);
    assert_eq!(sizing(&[]).unwrap(), BatchSizing::Fixed, "fixed by default");
    for kind in ["hardsync", "softsync", "async"] {
        let set = [format!("protocol.kind={kind}"), "training.batch_sizing=\"adaptive\"".to_owned()];
        assert_eq!(sizing(&[&set[0], &set[1]]).unwrap(), BatchSizing::Adaptive, "{kind}");
    }
    for kind in ["easgd", "diloco", "downpour"] {
        let e = load(&[&format!("protocol.kind={kind}"), "training.batch_sizing=\"adaptive\""]).unwrap_err();
        assert!(
            e.to_string().contains("training.batch_sizing") && e.to_string().contains("SGD rules"),
            "{e}"
        );
    }
    assert_eq!(key_of(&["training.batch_sizing=\"fast\""]), "training.batch_sizing");
}
