//! The run config's parsing, defaults, overrides and error messages.

use hla_data::prepared::Split;
use hla_model::backend::Kernels;
use hla_model::lm::{FeatureMap, LmConfig};

use super::train::Clip;
use super::*;

const FILE: &str = "[model]\nmixer = \"hla3\"\n\n[data]\ncorpus = \"tinyshakespeare\"\n";

#[test]
fn defaults_fill_what_the_file_leaves_out() {
    let config = RunConfig::parse(FILE, &[]).unwrap();
    assert_eq!(config.model.mixer, MixerKind::Hla3);
    assert_eq!(config.model.d_model, 128);
    assert_eq!(config.train, TrainSection::default());
    let again = RunConfig::parse(&config.to_toml(), &[]).unwrap();
    assert_eq!(again, config, "the saved config reads back the same");
}

#[test]
fn mixer_dependent_defaults_are_written_out() {
    let parse = |sets: &[&str]| {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        RunConfig::parse(FILE, &sets).unwrap().model
    };
    let explicit = |m: &LmConfig| (m.feature_map, m.normalize, m.output_norm);
    // Every linear-time mixer's default is the ratio normalisation: the denominator,
    // elu + 1, no output norm.
    let ratio = (Some(FeatureMap::EluPlusOne), Some(true), Some(false));
    for mixer in ["hla3", "ahla", "hla2", "linear"] {
        assert_eq!(explicit(&parse(&[&format!("model.mixer={mixer}")])), ratio);
    }
    // Without the denominator: L2 features for HLA (elu + 1 for linear attention) and the
    // output norm.
    let plain = (Some(FeatureMap::L2), Some(false), Some(true));
    assert_eq!(explicit(&parse(&["model.normalize=false"])), plain);
    assert_eq!(
        explicit(&parse(&["model.mixer=linear", "model.normalize=false"])),
        (Some(FeatureMap::EluPlusOne), Some(false), Some(true))
    );
    assert_eq!(
        parse(&["model.mixer=softmax"]).feature_map,
        None,
        "softmax has no feature map"
    );
    // A recorded run keeps its meaning when the defaults change: the keys are in its file.
    let recorded = RunConfig::parse(FILE, &[]).unwrap().to_toml();
    for key in [
        "feature_map = \"elu_plus_one\"",
        "normalize = true",
        "output_norm = false",
    ] {
        assert!(recorded.contains(key), "{key} not in\n{recorded}");
    }
}

/// `model.layers` names a mixer per layer, as many as `n_layers`, with `model.mixer` left
/// out; the recorded file reads back the same hybrid, and each recurrent layer keeps its
/// own feature map where their defaults differ.
#[test]
fn hybrid_stacks_name_a_mixer_per_layer() {
    const HYBRID: &str =
        "[model]\nlayers = [\"hla2\", \"hla2\", \"hla2\", \"softmax\"]\n[data]\ncorpus = \"x\"\n";
    let config = RunConfig::parse(HYBRID, &[]).unwrap();
    let (hla2, softmax) = (MixerKind::Hla2, MixerKind::Softmax);
    assert_eq!(config.model.mixers(), [hla2, hla2, hla2, softmax]);
    assert_eq!(config.model.mixer_label(), "hla2×3+softmax");
    let recorded = config.to_toml();
    assert!(recorded.contains("layers = ["), "{recorded}");
    assert_eq!(RunConfig::parse(&recorded, &[]).unwrap(), config);
    assert_eq!(config.model.feature_map, Some(FeatureMap::EluPlusOne));
    let mixed = ["model.n_layers=2", "model.layers=[\"linear\", \"hla2\"]"];
    let mut sets: Vec<String> = mixed.map(String::from).to_vec();
    sets.push("model.normalize=false".into());
    assert_eq!(
        RunConfig::parse(HYBRID, &sets).unwrap().model.feature_map,
        None
    );
    for (set, message) in [
        (
            "model.n_layers=3",
            "model.layers must be one mixer name per layer (n_layers of them), got 4 names for \
             n_layers = 3",
        ),
        (
            "model.mixer=softmax",
            "model.mixer must be left out when layers gives each layer's mixer",
        ),
        (
            "model.layers=[\"hla2\", \"mamba\", \"hla2\", \"hla2\"]",
            "model.layers: \"mamba\" is not one of hla2",
        ),
    ] {
        let err = RunConfig::parse(HYBRID, &[set.into()])
            .unwrap_err()
            .to_string();
        assert!(err.contains(message), "{set}: {err}");
    }
}

/// The global clip is the default and in every recorded config; `parameter` reads back.
#[test]
fn the_clip_is_global_unless_set() {
    let config = RunConfig::parse(FILE, &[]).unwrap();
    assert_eq!(config.train.clip, Clip::Global);
    assert_eq!(config.train.global_clip(), Some(1.0));
    assert!(config.to_toml().contains("clip = \"global\""));
    let sets = ["train.clip=parameter".into(), "train.grad_clip=0.5".into()];
    let parameter = RunConfig::parse(FILE, &sets).unwrap();
    assert_eq!(parameter.train.clip, Clip::Parameter);
    assert_eq!(
        (
            parameter.train.global_clip(),
            parameter.train.parameter_clip()
        ),
        (None, Some(0.5))
    );
    assert_eq!(
        RunConfig::parse(&parameter.to_toml(), &[]).unwrap(),
        parameter
    );
    let off = RunConfig::parse(FILE, &["train.grad_clip=0".into()]).unwrap();
    assert_eq!(
        (off.train.global_clip(), off.train.parameter_clip()),
        (None, None)
    );
}

#[test]
fn a_run_shorter_than_one_eval_interval_validates_at_its_end() {
    let config = RunConfig::parse(FILE, &["train.steps=40".into()]).unwrap();
    assert_eq!(config.train.eval_interval, 40);
    let sets = ["train.steps=600".into(), "train.eval_interval=250".into()];
    let err = RunConfig::parse(FILE, &sets).unwrap_err();
    assert!(format!("{err:#}").contains("multiple of"), "{err:#}");
}

#[test]
fn overrides_are_typed() {
    let sets = [
        "model.mixer=linear",
        "train.lr=3e-4",
        "model.shared_keys=true",
        "data.tokenizer=byte",
    ];
    let config = RunConfig::parse(FILE, &sets.map(String::from)).unwrap();
    assert_eq!(config.data.split, Split::Tail, "today's split by default");
    assert_eq!(config.model.mixer, MixerKind::Linear);
    assert_eq!(config.train.lr, 3e-4);
    assert!(config.model.shared_keys);
    let err = RunConfig::parse(FILE, &["train.steps=many".into()]).unwrap_err();
    assert!(format!("{err:#}").contains("invalid type"), "{err:#}");
    let list = [
        "data.corpus=[\"gutenberg\", \"sotu\"]",
        "data.split=\"documents\"",
        "data.split_seed=3",
    ];
    let config = RunConfig::parse(FILE, &list.map(String::from)).unwrap();
    let corpus = config.data.corpus.as_ref().map(|c| c.0.clone());
    assert_eq!(corpus, Some(vec!["gutenberg".into(), "sotu".into()]));
    assert_eq!(
        (config.data.split, config.data.split_seed),
        (Split::Documents, 3)
    );
    assert!(
        config
            .to_toml()
            .contains("corpus = [\n    \"gutenberg\",\n    \"sotu\",\n]"),
        "{}",
        config.to_toml()
    );
}

#[test]
fn mistakes_name_the_key_and_the_place() {
    let unknown = RunConfig::parse("[data]\ncorpus = \"x\"\nbatch = 3\n", &[])
        .unwrap_err()
        .to_string();
    assert!(
        unknown.contains("line 3") && unknown.contains("unknown field `batch`"),
        "{unknown}"
    );
    let mixer =
        RunConfig::parse("[model]\nmixer = \"mamba\"\n[data]\ncorpus = \"x\"\n", &[]).unwrap_err();
    assert!(
        mixer
            .to_string()
            .contains("\"mamba\" is not one of hla2, hla3, ahla, linear, softmax"),
        "{mixer}"
    );
    let missing = RunConfig::parse("[model]\n", &[]).unwrap_err().to_string();
    assert!(missing.contains("missing field `data`"), "{missing}");
    for (set, message) in [
        (
            "model.d_model=130",
            "model.n_heads must be a divisor of d_model",
        ),
        ("model.chunk_size=0", "model.chunk_size must be at least 1"),
        ("train.lr=-1", "train.lr must be positive and finite"),
        ("train.lr=2", "train.lr must be at most 1"),
        ("train.context=5000", "longer than model.max_seq_len"),
        (
            "model.decay_base=-1",
            "model.decay_base must be positive and finite",
        ),
        ("model.norm=\"batch\"", "\"batch\" is not one of rms, layer"),
        (
            "train.clip=\"norm\"",
            "train.clip: \"norm\" is not one of global, parameter",
        ),
        (
            "data.tokenizer=bpe:200",
            "data.tokenizer: \"bpe:200\" is not a BPE to train: bpe:N with N a whole number ≥ 257",
        ),
        (
            "data.split=books",
            "data.split: unknown variant `books`, expected `tail` or `documents`",
        ),
        (
            "data.corpus=[]",
            "data.corpus must be a corpus, or a list of one or more",
        ),
        (
            "data.corpus=[1]",
            "data.corpus: a corpus name or path, or a list of them",
        ),
    ] {
        let mut sets = vec![set.to_string()];
        if set.starts_with("train.context") {
            sets.push("model.mixer=softmax".into());
        }
        let err = RunConfig::parse(FILE, &sets).unwrap_err().to_string();
        assert!(err.contains(message), "{set}: {err}");
    }
    let learned = ["train.context=5000", "model.positions=\"learned\""].map(String::from);
    let err = RunConfig::parse(FILE, &learned).unwrap_err().to_string();
    assert!(
        err.contains("longer than model.max_seq_len (4096)"),
        "{err}"
    );
}

#[test]
fn shipped_configs_are_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
    let mut count = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        RunConfig::load(&path, &[]).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
        count += 1;
    }
    assert!(count >= 9, "smoke, 5 shakespeare-char and 3 mqar configs");
}

/// `train.form` picks the kernels a run sets; the default leaves the device's own.
#[test]
fn the_form_names_the_kernels_a_run_sets() {
    assert_eq!(RunConfig::parse(FILE, &[]).unwrap().train.form, Form::Auto);
    for (name, kernels) in [
        ("auto", Kernels::default()),
        ("fused", Kernels::All),
        ("node", Kernels::Nodes),
        ("composed", Kernels::None),
    ] {
        let config = RunConfig::parse(FILE, &[format!("train.form={name}")]).unwrap();
        assert_eq!(config.train.form.kernels(), kernels, "{name}");
        assert_eq!(RunConfig::parse(&config.to_toml(), &[]).unwrap(), config);
    }
    let node = RunConfig::parse(FILE, &["train.form=node".into()]).unwrap();
    assert!(node.train.describe_devices().ends_with(", the node form"));
    let err = format!(
        "{:#}",
        RunConfig::parse(FILE, &["train.form=tiles".into()]).unwrap_err()
    );
    assert!(
        err.contains("\"tiles\" is not one of auto, fused, node, composed"),
        "{err}"
    );
}

#[test]
fn devices_are_checked_by_name_and_split_evenly() {
    let two = ["train.devices=[\"cuda:0\", \"cuda:1\"]".to_string()];
    let config = RunConfig::parse(FILE, &two).unwrap();
    assert_eq!(config.train.batch_per_device(), 6);
    let ddp = [two[0].clone(), "train.strategy=ddp".into()];
    assert_eq!(
        RunConfig::parse(FILE, &ddp).unwrap().train.strategy,
        Strategy::Ddp,
        "a DDP config reads on a machine without CUDA"
    );
    for (sets, message) in [
        (
            vec!["train.devices=[\"flex\", \"flex\", \"flex\", \"flex\", \"flex\"]"],
            "train.batch_size (12) must be a multiple of the number of devices (5)",
        ),
        (
            vec!["train.devices=[\"gpu\"]"],
            "train.devices: unknown device \"gpu\"",
        ),
        (vec!["train.strategy=ddp"], "needs several CUDA devices"),
        (
            vec!["train.strategy=ring"],
            "\"ring\" is not one of multi, ddp",
        ),
    ] {
        let sets: Vec<String> = sets.into_iter().map(String::from).collect();
        let err = format!("{:#}", RunConfig::parse(FILE, &sets).unwrap_err());
        assert!(err.contains(message), "{sets:?}: {err}");
    }
}
