//! Batching examples into tensors.

use burn::data::dataloader::batcher::Batcher;
use burn::prelude::*;

use crate::windows::LmItem;

/// A batch of examples, padded to the longest (padding is not scored).
#[derive(Clone, Debug)]
pub struct LmBatch {
    /// `[batch, time]`.
    pub inputs: Tensor<2, Int>,
    /// `[batch, time]`: the token to predict after each input.
    pub targets: Tensor<2, Int>,
    /// `[batch, time]`: true where the target is scored.
    pub target_mask: Tensor<2, Bool>,
    /// `[scored]`: the flat positions `row · time + col` of the scored targets, in order;
    /// `None` when every target is scored. A loss needs the logits only there (MQAR scores
    /// a few positions of each example).
    pub scored: Option<Tensor<1, Int>>,
}

#[derive(Clone, Debug, Default)]
pub struct LmBatcher;

impl Batcher<LmItem, LmBatch> for LmBatcher {
    fn batch(&self, items: Vec<LmItem>, device: &Device) -> LmBatch {
        let batch = items.len();
        let time = items.iter().map(|i| i.inputs.len()).max().unwrap_or(0);
        let (mut inputs, mut targets, mut mask) = (
            vec![0i64; batch * time],
            vec![0i64; batch * time],
            vec![false; batch * time],
        );
        for (row, item) in items.iter().enumerate() {
            for (col, ((&x, &y), &m)) in item
                .inputs
                .iter()
                .zip(&item.targets)
                .zip(&item.mask)
                .enumerate()
            {
                let at = row * time + col;
                (inputs[at], targets[at], mask[at]) = (x.into(), y.into(), m);
            }
        }
        let scored = mask.contains(&false).then(|| {
            let at: Vec<i64> = (0..mask.len() as i64)
                .filter(|&at| mask[at as usize])
                .collect();
            let n = at.len();
            Tensor::from_data(TensorData::new(at, [n]), device)
        });
        LmBatch {
            inputs: Tensor::from_data(TensorData::new(inputs, [batch, time]), device),
            targets: Tensor::from_data(TensorData::new(targets, [batch, time]), device),
            target_mask: Tensor::from_data(TensorData::new(mask, [batch, time]), device),
            scored,
        }
    }
}
