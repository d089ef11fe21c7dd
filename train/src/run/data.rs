//! The data of a run: a prepared text corpus or generated MQAR sets, as Burn dataloaders.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use burn::data::dataloader::{DataLoader, DataLoaderBuilder};
use burn::data::dataset::{Dataset, InMemDataset};
use hla_data::DataError;
use hla_data::batch::{LmBatch, LmBatcher};
use hla_data::config::{Corpus, Task};
use hla_data::corpus;
use hla_data::prepared::{Meta, Prepared, TokenFile};
use hla_data::tokenizer::Tokenizer;
use hla_data::windows::{AllWindows, Draws, FullPass, LmItem, RandomWindows};

use crate::run::config::RunConfig;
use crate::run::usage::usage;

pub enum Data {
    Text {
        tokens: Arc<TokenFile>,
        train: std::ops::Range<usize>,
        valid: std::ops::Range<usize>,
        tokenizer: Tokenizer,
        /// The prepared corpus's metadata, recorded with the run.
        meta: Box<Meta>,
    },
    Mqar {
        train: Vec<LmItem>,
        test: Vec<LmItem>,
        vocab_size: usize,
    },
}

pub type Loader = Arc<dyn DataLoader<LmBatch>>;

impl Data {
    /// Prepares (or re-uses) the corpus, or generates the MQAR sets.
    pub fn load(config: &RunConfig) -> Result<Self> {
        Ok(match config.data.task()? {
            Task::Text { corpus } => Self::text(prepare(config, corpus, false)?.0),
            Task::Mqar(mqar) => Self::Mqar {
                train: mqar.train()?,
                test: mqar.test()?,
                vocab_size: mqar.vocab_size,
            },
        })
    }

    fn text(prepared: Prepared) -> Self {
        Self::Text {
            train: prepared.train_range(),
            valid: prepared.valid_range(),
            tokens: Arc::new(prepared.tokens),
            tokenizer: prepared.tokenizer,
            meta: Box::new(prepared.meta),
        }
    }

    pub fn vocab_size(&self) -> usize {
        match self {
            Self::Text { tokenizer, .. } => tokenizer.vocab_size(),
            Self::Mqar { vocab_size, .. } => *vocab_size,
        }
    }

    /// Input tokens of one training example.
    pub fn tokens_per_item(&self, config: &RunConfig) -> f64 {
        match self {
            Self::Text { .. } => config.train.context as f64,
            Self::Mqar { train, .. } => {
                train.iter().map(|i| i.inputs.len()).sum::<usize>() as f64
                    / train.len().max(1) as f64
            }
        }
    }

    pub fn is_mqar(&self) -> bool {
        matches!(self, Self::Mqar { .. })
    }

    /// Saves the tokenizer of a text task into `dir`.
    pub fn save_tokenizer(&self, path: &Path) -> Result<()> {
        if let Self::Text { tokenizer, .. } = self {
            tokenizer.save(path)?;
        }
        Ok(())
    }

    /// Saves the prepared corpus's metadata of a text task to `path`.
    pub fn save_meta(&self, path: &Path) -> Result<()> {
        if let Self::Text { meta, .. } = self {
            let json = serde_json::to_string_pretty(meta)?;
            std::fs::write(path, json)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        Ok(())
    }

    /// Epochs of `items` training examples drawn with replacement (random windows, as
    /// nanoGPT), continuing after `first_draw` earlier draws when a run resumes. With
    /// several devices the loader yields per-device batches, laid out so that burn-train's
    /// split hands the devices of one step together the draws of one whole batch.
    pub fn train_loader(
        &self,
        config: &RunConfig,
        items: usize,
        first_draw: u64,
        devices: usize,
    ) -> Result<Loader> {
        let (seed, batch) = (config.train.seed, config.train.batch_size / devices);
        Ok(match self {
            Self::Text { tokens, train, .. } => {
                let windows = AllWindows::new(tokens.clone(), train.clone(), config.train.context)?;
                let draws = Draws::new(windows, items, seed, first_draw);
                loader(draws.split(devices, batch)?, batch)
            }
            Self::Mqar { train, .. } => {
                let draws = Draws::new(InMemDataset::new(train.clone()), items, seed, first_draw);
                loader(draws.split(devices, batch)?, batch)
            }
        })
    }

    /// Validation during training: nanoGPT's estimate (`eval_batches` random batches) for
    /// text, the test set for MQAR.
    pub fn valid_loader(&self, config: &RunConfig, seed: u64) -> Result<Loader> {
        let batch = config.train.batch_size;
        Ok(match self {
            Self::Text { .. } => loader(self.random_window_set(config, seed)?, batch),
            Self::Mqar { test, .. } => loader(InMemDataset::new(test.clone()), batch),
        })
    }

    /// The windows of nanoGPT's validation estimate (text; MQAR has none).
    pub fn random_windows(&self, config: &RunConfig, seed: u64) -> Result<Option<Vec<LmItem>>> {
        if self.is_mqar() {
            return Ok(None);
        }
        let windows = self.random_window_set(config, seed)?;
        Ok(Some(
            (0..windows.len())
                .map(|i| windows.get(i).expect("in range"))
                .collect(),
        ))
    }

    fn random_window_set(&self, config: &RunConfig, seed: u64) -> Result<RandomWindows> {
        let Self::Text { tokens, valid, .. } = self else {
            unreachable!("random windows of a text task only");
        };
        let t = &config.train;
        Ok(RandomWindows::new(
            tokens.clone(),
            valid.clone(),
            t.context,
            t.eval_batches * t.batch_size,
            seed,
        )?)
    }

    /// Every validation token once (text) or the whole test set (MQAR), in order.
    pub fn full_pass(&self, config: &RunConfig) -> Result<Vec<LmItem>> {
        self.full_pass_at(config.train.context)
    }

    /// [`full_pass`](Self::full_pass) in windows of `context` tokens (text; MQAR's sets
    /// keep their own lengths).
    pub fn full_pass_at(&self, context: usize) -> Result<Vec<LmItem>> {
        Ok(match self {
            Self::Text { tokens, valid, .. } => {
                let pass = FullPass::new(tokens.clone(), valid.clone(), context)?;
                (0..pass.len())
                    .map(|i| pass.get(i).expect("in range"))
                    .collect()
            }
            Self::Mqar { test, .. } => test.clone(),
        })
    }
}

/// Prepares `corpus` as `config` says (or re-uses its preparation); a setting that does
/// not fit the corpus (`data.split = "documents"` of one document) is a usage error.
pub fn prepare(config: &RunConfig, corpus: &Corpus, force: bool) -> Result<(Prepared, bool)> {
    let data_dir = corpus::data_dir();
    match config
        .data
        .prepare_text(corpus, &data_dir, &corpus::cache_dir(), force)
    {
        Err(e @ DataError::Invalid { .. }) => Err(usage(e)),
        other => Ok(other?),
    }
}

fn loader(dataset: impl Dataset<LmItem> + 'static, batch_size: usize) -> Loader {
    DataLoaderBuilder::new(LmBatcher)
        .batch_size(batch_size)
        .num_workers(1)
        .build(dataset)
}
