//! Walking a sequence span by span (token by token for the recurrences, chunk by chunk
//! for the chunked forms), carrying a state.

use burn::prelude::*;

use super::HlaInput;

/// Applies `step` to consecutive spans of `size` tokens (the last may be shorter) and
/// concatenates the outputs along time.
pub(crate) fn scan<S>(
    input: &HlaInput,
    state: S,
    size: usize,
    step: impl Fn(&HlaInput, S) -> (Tensor<4>, S),
) -> (Tensor<4>, S) {
    assert!(size > 0, "the chunk size must be at least 1");
    let time = input.time();
    if time <= size {
        // One span: slicing would only cost a full-size gradient buffer in backward.
        return step(input, state);
    }
    let mut state = state;
    let mut outputs = Vec::with_capacity(time.div_ceil(size));
    for from in (0..time).step_by(size) {
        let (o, next) = step(&input.span(from, (from + size).min(time)), state);
        outputs.push(o);
        state = next;
    }
    (Tensor::cat(outputs, 2), state)
}
