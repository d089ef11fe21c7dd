//! Burn datasets of language-modelling windows over a token split.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use burn::data::dataset::{Dataset, DatasetError};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::DataError;
use crate::prepared::TokenFile;

/// One training example: `targets[i]` is the token after `inputs[i]`, scored where
/// `mask[i]` is true.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LmItem {
    pub inputs: Vec<u32>,
    pub targets: Vec<u32>,
    pub mask: Vec<bool>,
}

impl LmItem {
    /// Inputs and next-token targets of a run of `context + 1` tokens, all scored.
    fn shifted(tokens: Vec<u32>) -> Self {
        let n = tokens.len() - 1;
        Self {
            inputs: tokens[..n].to_vec(),
            targets: tokens[1..].to_vec(),
            mask: vec![true; n],
        }
    }
}

/// A split of a token file, read in windows of `context + 1` tokens.
struct Span {
    tokens: Arc<TokenFile>,
    split: Range<usize>,
    context: usize,
}

impl Span {
    fn new(
        name: &'static str,
        tokens: Arc<TokenFile>,
        split: Range<usize>,
        context: usize,
    ) -> Result<Self, DataError> {
        if split.len() < context + 1 {
            return Err(DataError::TooShort {
                split: name,
                needed: context + 1,
                got: split.len(),
            });
        }
        Ok(Self {
            tokens,
            split,
            context,
        })
    }

    /// The window starting `offset` tokens into the split (shorter at the split's end).
    fn window(&self, offset: usize) -> LmItem {
        let start = self.split.start + offset;
        let end = (start + self.context + 1).min(self.split.end);
        LmItem::shifted(self.tokens.read(start..end))
    }

    /// Windows that fit whole.
    fn starts(&self) -> usize {
        self.split.len() - self.context
    }
}

/// Random windows of `context + 1` tokens (nanoGPT's `get_batch`, and its validation
/// estimate): window `i` starts at a
/// position drawn from a generator seeded with `(seed, i)`, so the data does not depend on
/// the order or the thread it is read in. An epoch is `windows` windows.
pub struct RandomWindows {
    span: Span,
    windows: usize,
    seed: u64,
}

impl RandomWindows {
    pub fn new(
        tokens: Arc<TokenFile>,
        split: Range<usize>,
        context: usize,
        windows: usize,
        seed: u64,
    ) -> Result<Self, DataError> {
        let span = Span::new("validation", tokens, split, context)?;
        Ok(Self {
            span,
            windows,
            seed,
        })
    }
}

impl Dataset<LmItem> for RandomWindows {
    fn get(&self, index: usize) -> Result<LmItem, DatasetError> {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(index as u64);
        Ok(self.span.window(rng.random_range(0..self.span.starts())))
    }

    fn len(&self) -> usize {
        self.windows
    }
}

/// Every window of `context + 1` tokens in a split, window `i` starting at token `i`: the
/// population that training samples from (with replacement, like nanoGPT).
pub struct AllWindows(Span);

impl AllWindows {
    pub fn new(
        tokens: Arc<TokenFile>,
        split: Range<usize>,
        context: usize,
    ) -> Result<Self, DataError> {
        Span::new("training", tokens, split, context).map(Self)
    }
}

impl Dataset<LmItem> for AllWindows {
    fn get(&self, index: usize) -> Result<LmItem, DatasetError> {
        Ok(self.0.window(index))
    }

    fn len(&self) -> usize {
        self.0.starts()
    }
}

/// Consecutive, non-overlapping windows that cover a split once (a full validation pass);
/// the last may be shorter.
pub struct FullPass(Span);

impl FullPass {
    pub fn new(
        tokens: Arc<TokenFile>,
        split: Range<usize>,
        context: usize,
    ) -> Result<Self, DataError> {
        Span::new("validation", tokens, split, context).map(Self)
    }
}

impl Dataset<LmItem> for FullPass {
    fn get(&self, index: usize) -> Result<LmItem, DatasetError> {
        Ok(self.0.window(index * self.0.context))
    }

    fn len(&self) -> usize {
        (self.0.split.len() - 1).div_ceil(self.0.context)
    }
}

/// Sampling with replacement that can resume and be split over devices: read `e` of index
/// `j` (counting reads from 0) is draw `n = first_draw + e·size + order(j)`, the item
/// `inner[i]` with `i` drawn from a generator seeded with `(seed, n)`. An epoch reads every
/// index once; a run resumed after `k` epochs with `first_draw = k·size` sees the same data
/// as one that never stopped. Draws depend on the index and its read count only, never on
/// the order of reads, so data-loader threads cannot change them.
pub struct Draws<D> {
    inner: D,
    size: usize,
    seed: u64,
    first_draw: u64,
    split: Split,
    reads: Box<[AtomicU64]>,
}

/// How burn-train's multi-device split sees the epoch: `shares` contiguous parts, each
/// read in batches of `batch`.
#[derive(Clone, Copy, Debug)]
struct Split {
    shares: usize,
    batch: usize,
}

impl<D: Dataset<LmItem>> Draws<D> {
    pub fn new(inner: D, size: usize, seed: u64, first_draw: u64) -> Self {
        Self {
            inner,
            size,
            seed,
            first_draw,
            split: Split {
                shares: 1,
                batch: size.max(1),
            },
            reads: (0..size).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Orders the draws for a data loader cut into `shares` contiguous parts of equal
    /// length, each read in batches of `batch` (one part per device): batch `s` of every
    /// part together holds draws `s·shares·batch ..` `(s + 1)·shares·batch`, the draws of
    /// batch `s` of one loader with batch `shares·batch`. Each epoch must be a whole number
    /// of such batches.
    pub fn split(mut self, shares: usize, batch: usize) -> Result<Self, DataError> {
        let global = shares * batch;
        if global == 0 || !self.size.is_multiple_of(global) {
            return Err(DataError::Invalid {
                key: "an epoch of draws",
                requirement: format!("a multiple of {shares} shares × batch {batch}"),
                value: self.size.to_string(),
            });
        }
        self.split = Split { shares, batch };
        Ok(self)
    }

    /// The position in one loader's order of index `j` of the split loaders.
    fn order(&self, j: usize) -> usize {
        let Split { shares, batch } = self.split;
        let share = self.size / shares;
        let (part, local) = (j / share, j % share);
        (local / batch) * shares * batch + part * batch + local % batch
    }
}

impl<D: Dataset<LmItem>> Dataset<LmItem> for Draws<D> {
    fn get(&self, index: usize) -> Result<LmItem, DatasetError> {
        let Some(reads) = self.reads.get(index) else {
            return Err(DatasetError::new(DataError::Invalid {
                key: "a draw index",
                requirement: format!("below the epoch's {} draws", self.size),
                value: index.to_string(),
            }));
        };
        let epoch = reads.fetch_add(1, Ordering::SeqCst);
        let draw = self.first_draw + epoch * self.size as u64 + self.order(index) as u64;
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(draw);
        self.inner.get(rng.random_range(0..self.inner.len()))
    }

    fn len(&self) -> usize {
        self.size
    }
}
