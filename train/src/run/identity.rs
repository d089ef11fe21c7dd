//! A run's identity: the settings that give its checkpoints and its data their meaning,
//! fixed when the run is created. A resumed run may only extend or reschedule itself.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Result;

use super::config::RunConfig;
use super::run_dir::RunDir;
use super::usage::usage;

/// Keys that say where and how a run computes, not what: a run continues on other devices
/// or in another form (whose numbers agree to 1e-4).
const PLACEMENT: [&str; 3] = ["train.devices", "train.strategy", "train.form"];

/// Keys a resumed run may change: how long it trains, how often it validates and keeps
/// checkpoints, when it stops early, and the optimiser's schedule and coefficients (a run
/// that diverged continues with a lower `train.lr`). Every other key, those of `[model]`
/// and `[data]`, the seed and the batch shape among them, is part of the run's identity; a
/// key added later is too, until it is listed here.
const RESCHEDULE: [&str; 13] = [
    "train.steps",
    "train.eval_interval",
    "train.eval_batches",
    "train.keep_checkpoints",
    "train.early_stopping",
    "train.lr",
    "train.min_lr",
    "train.warmup_steps",
    "train.weight_decay",
    "train.beta1",
    "train.beta2",
    "train.grad_clip",
    "train.clip",
];

/// One setting that differs between two configs.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub key: String,
    pub old: String,
    pub new: String,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} → {}", self.key, self.old, self.new)
    }
}

/// The differences between a run's recorded config and a new one, placement aside.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Changes {
    /// Changes of the run's identity: a resume with any of them is refused.
    pub identity: Vec<Change>,
    /// Changes that extend or reschedule the run.
    pub schedule: Vec<Change>,
}

impl Changes {
    pub fn between(old: &RunConfig, new: &RunConfig) -> Self {
        let (old, new) = (flatten(old), flatten(new));
        let keys: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
        let unset = String::from("(unset)");
        let mut changes = Self::default();
        for key in keys {
            let (before, after) = (old.get(key), new.get(key));
            if before == after || PLACEMENT.contains(&key.as_str()) {
                continue;
            }
            let change = Change {
                key: key.clone(),
                old: before.unwrap_or(&unset).clone(),
                new: after.unwrap_or(&unset).clone(),
            };
            if RESCHEDULE.contains(&key.as_str()) {
                changes.schedule.push(change);
            } else {
                changes.identity.push(change);
            }
        }
        changes
    }

    /// Every change, identity first.
    pub fn all(&self) -> impl Iterator<Item = &Change> {
        self.identity.iter().chain(&self.schedule)
    }
}

/// Refuses to resume `run`, trained with `recorded`, with `config` when that would change
/// the run's identity: the usage error (exit status 2) names each key with its recorded
/// and its new value. Returns the changes that only reschedule the run.
pub fn check_resume(run: &RunDir, recorded: &RunConfig, config: &RunConfig) -> Result<Vec<Change>> {
    let changes = Changes::between(recorded, config);
    if changes.identity.is_empty() {
        return Ok(changes.schedule);
    }
    let lines: Vec<String> = changes
        .identity
        .iter()
        .map(|c| format!("  {}: {} (recorded) → {}", c.key, c.old, c.new))
        .collect();
    Err(usage(format!(
        "{} holds a run trained with other settings, which a resume cannot change:\n{}\nstart \
         a new run with another --out, or start this one over with --force",
        run.path().display(),
        lines.join("\n")
    )))
}

/// Every leaf of the config by its dotted key, as TOML writes its value.
fn flatten(config: &RunConfig) -> BTreeMap<String, String> {
    fn walk(prefix: &str, value: &toml::Value, into: &mut BTreeMap<String, String>) {
        match value {
            toml::Value::Table(table) => {
                for (key, value) in table {
                    let path = if prefix.is_empty() {
                        key.clone()
                    } else {
                        format!("{prefix}.{key}")
                    };
                    walk(&path, value, into);
                }
            }
            leaf => {
                into.insert(prefix.to_string(), leaf.to_string());
            }
        }
    }
    let mut into = BTreeMap::new();
    let value = toml::Value::try_from(config).expect("the config serialises");
    walk("", &value, &mut into);
    into
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(sets: &[&str]) -> RunConfig {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        RunConfig::parse("[data]\ncorpus = \"x\"\n", &sets).unwrap()
    }

    #[test]
    fn changes_name_the_keys_and_split_identity_from_schedule() {
        let a = config(&[]);
        let b = config(&["train.lr=3e-3", "model.mixer=ahla", "model.normalize=false"]);
        let changes = Changes::between(&a, &b);
        // The keys whose defaults follow from others (here from `normalize`) count too.
        let identity: Vec<String> = changes.identity.iter().map(Change::to_string).collect();
        assert_eq!(
            identity,
            [
                "model.feature_map: \"elu_plus_one\" → \"l2\"",
                "model.mixer: \"hla2\" → \"ahla\"",
                "model.normalize: true → false",
                "model.output_norm: false → true",
            ]
        );
        assert_eq!(changes.schedule[0].to_string(), "train.lr: 0.001 → 0.003");
        assert_eq!(changes.schedule.len(), 1);
        assert_eq!(Changes::between(&a, &a), Changes::default());
        for placement in ["train.devices=[\"flex\", \"flex\"]", "train.form=\"node\""] {
            let elsewhere = config(&[placement]);
            assert_eq!(Changes::between(&a, &elsewhere), Changes::default());
        }
    }

    #[test]
    fn the_seed_the_batch_shape_and_the_data_are_identity() {
        let a = config(&[]);
        for set in [
            "train.seed=7",
            "train.batch_size=24",
            "train.context=32",
            "train.grad_accumulation=2",
            "data.tokenizer=\"byte\"",
            "model.d_model=64",
        ] {
            let changes = Changes::between(&a, &config(&[set]));
            assert_eq!(changes.identity.len(), 1, "{set}");
            assert!(changes.schedule.is_empty(), "{set}");
        }
        for set in [
            "train.steps=4000",
            "train.eval_interval=500",
            "train.early_stopping=3",
        ] {
            let changes = Changes::between(&a, &config(&[set]));
            assert!(changes.identity.is_empty(), "{set}");
            assert_eq!(changes.schedule.len(), 1, "{set}");
        }
    }
}
