//! A quiet progress printer for logs (CI, pipes): one line per validation.

use std::collections::HashMap;

use burn::train::logger::{EvaluationProgressLogger, TrainingProgressLogger};
use burn::train::metric::{MetricDefinition, MetricId};
use burn::train::renderer::{
    EvaluationName, MetricState, MetricsRenderer, MetricsRendererEvaluation,
    MetricsRendererTraining,
};

use crate::run::history::Cadence;

pub struct QuietRenderer {
    names: HashMap<MetricId, String>,
    train: Vec<(String, String)>,
    valid: Vec<(String, String)>,
    epochs: usize,
    /// Where this process's epochs start and how many steps each is.
    cadence: Cadence,
}

impl QuietRenderer {
    pub fn new(cadence: Cadence) -> Self {
        Self {
            names: HashMap::new(),
            train: Vec::new(),
            valid: Vec::new(),
            epochs: 0,
            cadence,
        }
    }

    fn record(&self, into: &mut Vec<(String, String)>, state: MetricState) {
        let entry = match state {
            MetricState::Generic(e) | MetricState::Numeric(e, _) => e,
        };
        let name = self
            .names
            .get(&entry.metric_id)
            .cloned()
            .unwrap_or_default();
        // `formatted` reads "epoch <running mean> - batch <last>": keep the running mean.
        let formatted = entry.serialized_entry.formatted;
        let value = formatted.split(" - ").next().unwrap_or(&formatted);
        let value = value.trim_start_matches("epoch ").to_string();
        into.retain(|(n, _)| *n != name);
        into.push((name, value));
    }
}

fn line(entries: &[(String, String)]) -> String {
    entries
        .iter()
        .map(|(name, value)| format!("{name} {value}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl MetricsRendererTraining for QuietRenderer {
    fn update_train(&mut self, state: MetricState) {
        let mut train = std::mem::take(&mut self.train);
        self.record(&mut train, state);
        self.train = train;
    }

    fn update_valid(&mut self, state: MetricState) {
        let mut valid = std::mem::take(&mut self.valid);
        self.record(&mut valid, state);
        self.valid = valid;
    }
}

impl MetricsRendererEvaluation for QuietRenderer {
    fn update_test(&mut self, _name: EvaluationName, _state: MetricState) {}
}

impl MetricsRenderer for QuietRenderer {
    fn manual_close(&mut self) {}

    fn register_metric(&mut self, definition: MetricDefinition) {
        self.names
            .insert(definition.metric_id, definition.name.to_string());
    }
}

impl TrainingProgressLogger for QuietRenderer {
    fn start(
        &mut self,
        total_epochs: usize,
        starting_epoch: usize,
        _items: Option<usize>,
        _label: Option<&str>,
    ) {
        self.epochs = total_epochs;
        if starting_epoch > 1 {
            println!("resuming at step {}", self.cadence.first_step);
        }
    }

    fn update_epoch(&mut self, epoch: usize) {
        println!(
            "step {:>6}/{}  train: {}  |  valid: {}",
            self.cadence.step_at(epoch),
            self.cadence.step_at(self.epochs),
            line(&self.train),
            line(&self.valid)
        );
    }

    fn start_split(&mut self, _split: &str, _total_items: usize) {}

    fn update_split(&mut self, _items_processed: usize) {}

    fn end_split(&mut self) {}

    fn end(&mut self) {}

    fn log_event_training(&mut self, _event: String) {}
}

impl EvaluationProgressLogger for QuietRenderer {
    fn start_global_progress(&mut self, _total_tests: usize) {}

    fn start_test(&mut self, _name: &str, _total_items: usize) {}

    fn update_test_progress(&mut self, _items_processed: usize) {}

    fn end_test(&mut self) {}

    fn end_global_progress(&mut self) {}

    fn log_event_evaluation(&mut self, _event: String) {}
}
