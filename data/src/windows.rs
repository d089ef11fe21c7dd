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

/// Sampling with replacement that can resume: the `n`-th item read (counting from
/// `first_draw`) is `inner[i]` with `i` drawn from a generator seeded with `(seed, n)`. An
/// epoch is `size` reads; a run resumed after `k` reads and started with `first_draw = k`
/// sees the same data as one that never stopped (items must be read in order, as a
/// single-worker data loader does).
pub struct Draws<D> {
    inner: D,
    size: usize,
    seed: u64,
    next: AtomicU64,
}

impl<D: Dataset<LmItem>> Draws<D> {
    pub fn new(inner: D, size: usize, seed: u64, first_draw: u64) -> Self {
        Self {
            inner,
            size,
            seed,
            next: AtomicU64::new(first_draw),
        }
    }
}

impl<D: Dataset<LmItem>> Dataset<LmItem> for Draws<D> {
    fn get(&self, _index: usize) -> Result<LmItem, DatasetError> {
        let draw = self.next.fetch_add(1, Ordering::SeqCst);
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(draw);
        self.inner.get(rng.random_range(0..self.inner.len()))
    }

    fn len(&self) -> usize {
        self.size
    }
}
