//! The means over `mean_over` axes (seeds, typically): one line per mean group, each
//! outcome as the mean and the sample standard deviation of the group's runs.

use super::Row;

/// Mean and sample standard deviation (divisor n − 1) of some runs' values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stat {
    pub mean: f64,
    /// `None` for a single run.
    pub std: Option<f64>,
}

impl Stat {
    /// `None` without values.
    pub fn of(values: &[f64]) -> Option<Self> {
        let n = values.len() as f64;
        if values.is_empty() {
            return None;
        }
        let mean = values.iter().sum::<f64>() / n;
        let std = (values.len() > 1).then(|| {
            let squares: f64 = values.iter().map(|v| (v - mean).powi(2)).sum();
            (squares / (n - 1.0)).sqrt()
        });
        Some(Self { mean, std })
    }

    /// `1.8160 ± 0.0050`, or `1.8160` for one run.
    pub fn show(&self) -> String {
        match self.std {
            Some(std) => format!("{:.4} ± {std:.4}", self.mean),
            None => format!("{:.4}", self.mean),
        }
    }
}

/// The runs of one mean group.
#[derive(Debug, Clone)]
pub struct Mean {
    /// The group's first run with its name, speed and outcomes replaced by the group's
    /// (means; the validation curve at the steps every run logged), for tables and charts.
    pub row: Row,
    pub runs: usize,
    pub final_loss: Stat,
    /// Present when every run has it.
    pub estimate_loss: Option<Stat>,
    pub final_accuracy: Option<Stat>,
}

/// One [`Mean`] per mean group, in the order the groups first appear.
pub fn means(rows: &[Row]) -> Vec<Mean> {
    let mut groups: Vec<Vec<&Row>> = Vec::new();
    for row in rows {
        match groups
            .iter_mut()
            .find(|g| g[0].mean_group == row.mean_group)
        {
            Some(group) => group.push(row),
            None => groups.push(vec![row]),
        }
    }
    groups.iter().map(|group| mean_of(group)).collect()
}

fn mean_of(group: &[&Row]) -> Mean {
    let values = |f: fn(&Row) -> f64| group.iter().map(|r| f(r)).collect::<Vec<_>>();
    let all = |f: fn(&Row) -> Option<f64>| group.iter().map(|r| f(r)).collect::<Option<Vec<_>>>();
    let stat = |values: Vec<f64>| Stat::of(&values).expect("a group has a run");
    let final_loss = stat(values(|r| r.final_loss));
    let estimate_loss = all(|r| r.estimate_loss).map(stat);
    let final_accuracy = all(|r| r.final_accuracy).map(stat);
    let mut row = group[0].clone();
    row.name = row.mean_group.clone();
    row.wall_seconds = stat(values(|r| r.wall_seconds)).mean;
    row.tokens_per_second = stat(values(|r| r.tokens_per_second)).mean;
    row.final_loss = final_loss.mean;
    row.estimate_loss = estimate_loss.map(|s| s.mean);
    row.final_accuracy = final_accuracy.map(|s| s.mean);
    row.best_loss = all(|r| r.best_loss).map(|v| stat(v).mean);
    row.best_accuracy = all(|r| r.best_accuracy).map(|v| stat(v).mean);
    row.curve = mean_curve(group);
    Mean {
        row,
        runs: group.len(),
        final_loss,
        estimate_loss,
        final_accuracy,
    }
}

/// The mean validation loss at each step that every run of the group logged.
fn mean_curve(group: &[&Row]) -> Vec<(usize, f64)> {
    group[0]
        .curve
        .iter()
        .filter_map(|&(step, _)| {
            let at: Option<Vec<f64>> = group
                .iter()
                .map(|r| r.curve.iter().find(|p| p.0 == step).map(|p| p.1))
                .collect();
            Some((step, Stat::of(&at?)?.mean))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_is_the_mean_and_sample_deviation() {
        let s = Stat::of(&[1.0, 2.0, 3.0, 4.0]).unwrap();
        assert_eq!(s.mean, 2.5);
        assert!((s.std.unwrap() - (5.0f64 / 3.0).sqrt()).abs() < 1e-12);
        assert_eq!(s.show(), "2.5000 ± 1.2910");
        assert_eq!(Stat::of(&[1.8]).unwrap().show(), "1.8000");
        assert_eq!(Stat::of(&[]), None);
    }
}
