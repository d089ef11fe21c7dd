//! Training a byte-level BPE (GPT-2's kind: bytes mapped to printable characters, text
//! split by GPT-2's pattern, no prefix space) with the `tokenizers` crate's trainer.

use tokenizers::AddedToken;
use tokenizers::models::TrainerWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainer};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;

use super::END_OF_TEXT_NAMES;
use crate::DataError;

/// A BPE of at most `vocab_size` entries trained on `texts`, `<|endoftext|>` its id 0 and
/// the 256 bytes the next ids. Deterministic: the trainer counts words, then merges the
/// most frequent pair, ties to the smallest pair of ids.
pub fn train(
    vocab_size: usize,
    texts: impl Iterator<Item = String> + Send,
) -> Result<tokenizers::Tokenizer, DataError> {
    let failed = |e: tokenizers::Error| DataError::Tokenize(format!("BPE training: {e}"));
    let bytes = ByteLevel::default().add_prefix_space(false);
    let mut tokenizer = tokenizers::Tokenizer::new(BPE::default());
    tokenizer
        .with_pre_tokenizer(Some(bytes))
        .with_decoder(Some(bytes));
    let trainer = BpeTrainer::builder()
        .vocab_size(vocab_size)
        .min_frequency(0)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .special_tokens(vec![AddedToken::from(END_OF_TEXT_NAMES[0], true)])
        .build();
    let mut trainer = TrainerWrapper::from(trainer);
    tokenizer.train(&mut trainer, texts).map_err(failed)?;
    Ok(tokenizer)
}
