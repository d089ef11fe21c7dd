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
        if let Some(text) = self.advance_at(n, Instant::now()) {
            eprint!("{text}");
            let _ = std::io::stderr().flush();
        }
    }

    /// Clears the bar (a terminal) once the pass is over.
    pub fn finish(self) {
        if self.terminal && self.shown.is_some() {
            eprint!("\r\x1b[2K");
            let _ = std::io::stderr().flush();
        }
    }

    /// [`Self::advance`] at `now`: what to print, if it is time to.
    fn advance_at(&mut self, n: usize, now: Instant) -> Option<String> {
        self.done = (self.done + n).min(self.total);
        let every = if self.terminal {
            DRAW_EVERY
        } else {
            LINE_EVERY
        };
        // The first line waits as long as the others: a short pass prints nothing.
        if now.duration_since(self.shown.unwrap_or(self.start)) < every {
            return None;
        }
        self.shown = Some(now);
        Some(self.text(now.duration_since(self.start).as_secs_f64()))
    }

    /// The bar (a terminal: redrawn over the last) or a line, `elapsed` seconds in.
    fn text(&self, elapsed: f64) -> String {
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
            format!("\r\x1b[2K{} [{bar}] {counts}", self.label)
        } else {
            format!("{}: {counts}\n", self.label)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(terminal: bool) -> Progress {
        Progress {
            terminal,
            ..Progress::new("Recurrent validation", 1000, "tokens")
        }
    }

    /// In a log, a line every five seconds and none before the first five (a short pass
    /// prints nothing); each says how far, how long and how long to go.
    #[test]
    fn lines_come_every_few_seconds_in_logs() {
        let mut p = progress(false);
        let at = |s: f64| p.start + Duration::from_secs_f64(s);
        let (t1, t2, t3, t4) = (at(1.0), at(5.5), at(8.0), at(11.0));
        assert_eq!(p.advance_at(100, t1), None);
        assert_eq!(
            p.advance_at(100, t2).as_deref(),
            Some("Recurrent validation: 200/1000 tokens (20%), 6 s, ~22 s left\n")
        );
        assert_eq!(p.advance_at(100, t3), None);
        let line = p.advance_at(700, t4).expect("a line after 5 more seconds");
        assert!(
            line.starts_with("Recurrent validation: 1000/1000 tokens (100%)"),
            "{line}"
        );
    }

    /// On a terminal, a bar redrawn in place at most five times a second.
    #[test]
    fn a_terminal_gets_a_bar() {
        let mut p = progress(true);
        let at = |s: f64| p.start + Duration::from_secs_f64(s);
        let (t1, t2) = (at(0.1), at(0.5));
        assert_eq!(p.advance_at(500, t1), None);
        let bar = p.advance_at(0, t2).expect("a bar");
        assert!(
            bar.starts_with(
                "\r\x1b[2KRecurrent validation [###############               ] 500/1000"
            ),
            "{bar}"
        );
    }
}
