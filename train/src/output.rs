//! A standard output or error that cannot be written (a full disk behind `hla train >
//! log`) ends `hla` with one message and exit status 1, instead of `println!`'s panic.

use std::io::Write;

/// What Rust's print macros panic with when a write fails.
const FAILED_PRINT: &str = "failed printing to ";

/// Installs a panic hook, in front of the current one, that ends the process on a failed
/// print. Every file `hla` writes is written atomically, so ending mid-run loses nothing
/// that a `--resume` needs.
pub fn exit_on_failed_prints() {
    let next = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        match info.payload_as_str() {
            Some(message) if message.starts_with(FAILED_PRINT) => {
                let cause = &message[FAILED_PRINT.len()..];
                // stderr may be the failing stream itself: then only the status tells.
                let _ = writeln!(std::io::stderr(), "error: cannot write to {cause}");
                crate::device::exit_now(1)
            }
            _ => next(info),
        }
    }));
}
