//! Progress of a long pass (a full validation) on stderr: a bar redrawn in place on a
//! terminal, otherwise a line every few seconds, so that logs show it too without
//! filling up.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Seconds between lines when stderr is not a terminal.
const LINE_EVERY: Duration = Duration::from_secs(5);
/// Redraws of the bar at most this often.
const DRAW_EVERY: Duration = Duration::from_millis(200);
const BAR: usize = 30;

pub struct Progress {
    label: String,
    unit: &'static str,
    total: usize,
    done: usize,
    start: Instant,
    shown: Option<Instant>,
    terminal: bool,
}

impl Progress {
    /// Progress of `label` over `total` `unit`s (e.g. tokens).
    pub fn new(label: &str, total: usize, unit: &'static str) -> Self {
        Self {
            label: label.to_string(),
            unit,
            total,
            done: 0,
            start: Instant::now(),
            shown: None,
            terminal: std::io::stderr().is_terminal(),
        }
    }

    /// `n` more units done.
    pub fn advance(&mut self, n: usize) {
        self.done = (self.done + n).min(self.total);
        let now = Instant::now();
        let every = if self.terminal {
            DRAW_EVERY
        } else {
            LINE_EVERY
        };
        // The first line waits as long as the others: a short pass prints nothing.
        let since = now - self.shown.unwrap_or(self.start);
        if since >= every {
            self.shown = Some(now);
            self.show();
        }
    }

    /// Clears the bar (a terminal) once the pass is over.
    pub fn finish(self) {
        if self.terminal && self.shown.is_some() {
            eprint!("\r\x1b[2K");
            let _ = std::io::stderr().flush();
        }
    }

    fn show(&self) {
        let elapsed = self.start.elapsed().as_secs_f64();
        let share = self.done as f64 / self.total.max(1) as f64;
        let left = if self.done > 0 {
            format!(", ~{:.0} s left", elapsed * (1.0 - share) / share)
        } else {
            String::new()
        };
        let counts = format!(
            "{}/{} {} ({:.0}%), {elapsed:.0} s{left}",
            self.done,
            self.total,
            self.unit,
            100.0 * share
        );
        if self.terminal {
            let filled = ((share * BAR as f64) as usize).min(BAR);
            let bar = format!("{}{}", "#".repeat(filled), " ".repeat(BAR - filled));
            eprint!("\r\x1b[2K{} [{bar}] {counts}", self.label);
            let _ = std::io::stderr().flush();
        } else {
            eprintln!("{}: {counts}", self.label);
        }
    }
}
