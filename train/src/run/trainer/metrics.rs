//! burn-train's perplexity and accuracy metrics from the counts the fused head computes
//! (the loss and the hits of a batch's scored tokens), where Burn's own metrics read the
//! `[tokens, vocab]` logits again, which at a GPT-2 vocabulary cost as much as the step.

use std::sync::Arc;

use burn::prelude::*;
use burn::tensor::TensorReadError;
use burn::train::metric::state::{FormatOptions, NumericMetricState};
use burn::train::metric::{
    Metric, MetricAttributes, MetricMetadata, MetricName, Numeric, NumericAttributes, NumericEntry,
    SerializedEntry, format_float,
};

/// What both metrics read from a batch.
pub struct TokenCounts {
    /// `[1]`: the mean negative log-likelihood of the scored tokens.
    pub loss: Tensor<1>,
    /// `[1]`: how many scored tokens the model predicted (top logit).
    pub hits: Tensor<1>,
    /// Scored tokens.
    pub tokens: usize,
}

/// `exp` of the mean negative log-likelihood per token, over the batch and over the epoch
/// so far (the epoch's from its summed likelihoods, as Burn's `PerplexityMetric`).
#[derive(Clone)]
pub struct PerplexityMetric {
    name: MetricName,
    nll: f64,
    tokens: usize,
    current: f64,
    current_tokens: usize,
}

impl PerplexityMetric {
    pub fn new() -> Self {
        Self {
            name: Arc::new("Perplexity".into()),
            nll: 0.0,
            tokens: 0,
            current: f64::NAN,
            current_tokens: 0,
        }
    }

    fn running(&self) -> f64 {
        if self.tokens == 0 {
            f64::INFINITY
        } else {
            (self.nll / self.tokens as f64).exp()
        }
    }

    fn entry(&self, last: bool) -> SerializedEntry {
        let (current, running) = (
            format_float(self.current, 2),
            format_float(self.running(), 2),
        );
        let serialized = if last {
            NumericEntry::Final(self.running())
        } else {
            NumericEntry::Aggregated {
                aggregated_value: self.current,
                count: self.current_tokens,
            }
        };
        let formatted = format!("epoch {running} - batch {current}");
        SerializedEntry::new(formatted, serialized.serialize())
    }
}

impl Metric for PerplexityMetric {
    type Input = TokenCounts;

    fn update(
        &mut self,
        input: &TokenCounts,
        _: &MetricMetadata,
    ) -> Result<SerializedEntry, TensorReadError> {
        let loss = input.loss.clone().try_into_scalar::<f64>()?;
        self.nll += loss * input.tokens as f64;
        self.tokens += input.tokens;
        self.current = loss.exp();
        self.current_tokens = input.tokens;
        Ok(self.entry(false))
    }

    fn compute(&mut self) -> Result<SerializedEntry, TensorReadError> {
        Ok(self.entry(true))
    }

    fn clear(&mut self) {
        *self = Self {
            name: self.name.clone(),
            ..Self::new()
        };
    }

    fn name(&self) -> MetricName {
        self.name.clone()
    }

    fn attributes(&self) -> MetricAttributes {
        NumericAttributes {
            unit: None,
            higher_is_better: false,
        }
        .into()
    }
}

impl Numeric for PerplexityMetric {
    fn value(&self) -> Option<NumericEntry> {
        Some(NumericEntry::Aggregated {
            aggregated_value: self.current,
            count: self.current_tokens,
        })
    }

    fn running_value(&self) -> Option<NumericEntry> {
        Some(NumericEntry::Aggregated {
            aggregated_value: self.running(),
            count: self.tokens,
        })
    }

    fn final_value(&self) -> NumericEntry {
        NumericEntry::Final(self.running())
    }
}

/// The share of scored tokens whose target is the top logit, in percent.
#[derive(Clone)]
pub struct AccuracyMetric {
    name: MetricName,
    state: NumericMetricState,
}

impl AccuracyMetric {
    pub fn new() -> Self {
        Self {
            name: Arc::new("Accuracy".into()),
            state: NumericMetricState::new(),
        }
    }

    fn format(&self) -> FormatOptions {
        FormatOptions::new(self.name.clone()).unit("%").precision(2)
    }
}

impl Metric for AccuracyMetric {
    type Input = TokenCounts;

    fn update(
        &mut self,
        input: &TokenCounts,
        _: &MetricMetadata,
    ) -> Result<SerializedEntry, TensorReadError> {
        let hits = input.hits.clone().try_into_scalar::<f64>()?;
        let accuracy = 100.0 * hits / input.tokens.max(1) as f64;
        self.state.update(accuracy, input.tokens);
        Ok(self.state.compute_update(self.format()))
    }

    fn compute(&mut self) -> Result<SerializedEntry, TensorReadError> {
        Ok(self.state.compute_final(self.format()))
    }

    fn clear(&mut self) {
        self.state.reset();
    }

    fn name(&self) -> MetricName {
        self.name.clone()
    }

    fn attributes(&self) -> MetricAttributes {
        NumericAttributes {
            unit: Some("%".into()),
            higher_is_better: true,
        }
        .into()
    }
}

impl Numeric for AccuracyMetric {
    fn value(&self) -> Option<NumericEntry> {
        Some(self.state.current_value())
    }

    fn running_value(&self) -> Option<NumericEntry> {
        Some(self.state.running_value())
    }

    fn final_value(&self) -> NumericEntry {
        self.state.final_value()
    }
}
