//! The experiment file: expansion of runs and sweeps, names, and its mistakes.

use super::*;

fn parse(text: &str) -> Result<Experiment> {
    Experiment::parse(text, Path::new("experiments/x"))
}

fn error(text: &str) -> String {
    format!("{:#}", parse(text).unwrap_err())
}

#[test]
fn runs_and_sweeps_expand_in_order() {
    let experiment = parse(
        r#"
        config = "base.toml"
        set = ["train.steps=10"]
        [results]
        best_of = ["lr"]
        mean_over = ["tn"]
        [[run]]
        name = "one"
        config = "other.toml"
        set = ["model.mixer=linear"]
        [[sweep]]
        name = "g"
        set = ["model.d_model=64"]
        [[sweep.axis]]
        key = "model.mixer"
        values = ["hla2", "ahla"]
        [[sweep.axis]]
        name = "lr"
        key = "train.lr"
        values = [1e-3, 0.01]
        [[sweep.axis]]
        name = "tn"
        cases = [{ label = "T64", set = ["a.b=1", "c.d=2"] }]
        "#,
    )
    .unwrap();
    assert_eq!(experiment.title, "x");
    let names: Vec<&str> = experiment.runs.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "one",
            "g-hla2-lr0.001-T64",
            "g-hla2-lr0.01-T64",
            "g-ahla-lr0.001-T64",
            "g-ahla-lr0.01-T64"
        ]
    );
    let first = &experiment.runs[0];
    assert_eq!(first.config, Path::new("experiments/x/other.toml"));
    assert_eq!(first.set, ["train.steps=10", "model.mixer=linear"]);
    assert_eq!(first.group, "one");
    assert_eq!(first.mean_group, "one");
    let swept = &experiment.runs[2];
    assert_eq!(swept.config, Path::new("experiments/x/base.toml"));
    assert_eq!(
        swept.set,
        [
            "train.steps=10",
            "model.d_model=64",
            "model.mixer=\"hla2\"",
            "train.lr=0.01",
            "a.b=1",
            "c.d=2"
        ]
    );
    assert_eq!(
        swept.group, "g-hla2-T64",
        "the best_of axis leaves the group"
    );
    assert_eq!(experiment.runs[1].group, swept.group);
    assert_eq!(
        swept.mean_group, "g-hla2-lr0.01",
        "the mean_over axis leaves the mean group"
    );
}

#[test]
fn a_sweep_without_a_name_is_named_by_its_labels() {
    let experiment = parse(
        "config = \"c.toml\"\n[[sweep]]\n[[sweep.axis]]\nkey = \"model.short_conv\"\nvalues = [0, 4]\n",
    )
    .unwrap();
    let names: Vec<&str> = experiment.runs.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["short_conv0", "short_conv4"]);
}

#[test]
fn mistakes_are_named() {
    for (text, message) in [
        (
            "[[run]]\nname = \"a\"\nconfg = \"c.toml\"\n",
            "unknown field `confg`",
        ),
        ("title = 3\n", "invalid type"),
        ("", "lists no runs"),
        ("[[run]]\nname = \"a\"\n", "\"a\" has no config"),
        (
            "config = \"c\"\n[[run]]\nname = \"a\"\n[[run]]\nname = \"a\"\n",
            "two runs are named \"a\"",
        ),
        (
            "config = \"c\"\n[[run]]\nname = \"a/b\"\n",
            "may use only letters",
        ),
        (
            "config = \"c\"\n[[sweep]]\nname = \"s\"\n",
            "has no [[sweep.axis]]",
        ),
        (
            "config = \"c\"\n[[sweep]]\nname = \"s\"\n[[sweep.axis]]\nkey = \"train.lr\"\n",
            "either `key` and `values`",
        ),
        (
            "config = \"c\"\n[[sweep]]\nname = \"s\"\n[[sweep.axis]]\ncases = []\n",
            "needs a `name`",
        ),
        (
            "config = \"c\"\n[[sweep]]\nname = \"s\"\n[[sweep.axis]]\nkey = \"a.b\"\nvalues = []\n",
            "has no values",
        ),
        (
            "config = \"c\"\n[results]\nbest_of = [\"lr\"]\n[[run]]\nname = \"a\"\n",
            "no sweep has an axis named \"lr\"",
        ),
        (
            "config = \"c\"\n[results]\nmean_over = [\"seed\"]\n[[run]]\nname = \"a\"\n",
            "results.mean_over: no sweep has an axis named \"seed\"",
        ),
        (
            "config = \"c\"\n[results]\nbest_of = [\"lr\"]\nmean_over = [\"lr\"]\n[[sweep]]\n[[sweep.axis]]\nkey = \"train.lr\"\nvalues = [1]\n",
            "\"lr\" is in both best_of and mean_over",
        ),
        (
            "config = \"c\"\n[results]\nmetric = \"bleu\"\n[[run]]\nname = \"a\"\n",
            "unknown variant `bleu`",
        ),
    ] {
        let err = error(text);
        assert!(err.contains(message), "{text:?}: {err}");
    }
}

#[test]
fn shipped_experiments_are_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../experiments");
    let mut count = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        // Experiment folders hold an experiment.toml (bench/ and README.md do not).
        let path = entry.unwrap().path().join("experiment.toml");
        if !path.is_file() {
            continue;
        }
        let experiment =
            Experiment::load(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
        for run in &experiment.runs {
            crate::run::config::RunConfig::load(&run.config, &run.set)
                .unwrap_or_else(|e| panic!("{}: {}: {e:#}", path.display(), run.name));
        }
        count += 1;
    }
    assert!(count >= 3, "shakespeare-char, mqar and mqar-long");
}

#[test]
fn a_missing_file_is_a_usage_error() {
    let err = Experiment::load(Path::new("/no/such/experiment.toml")).unwrap_err();
    assert!(err.is::<UsageError>());
    assert!(err.to_string().contains("cannot read the experiment file"));
}
