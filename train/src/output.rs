//! How `hla` ends: a standard output or error that cannot be written (a full disk behind
//! `hla train > log`) ends it with one message and exit status 1, instead of `println!`'s
//! panic; after a wgpu device, it ends without the C libraries' exit handlers.

use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

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
                exit_now(1)
            }
            _ => next(info),
        }
    }));
}

/// Whether this process has started (or tried to start) a wgpu device; see [`exit`].
static WGPU_STARTED: AtomicBool = AtomicBool::new(false);

/// Records that this process starts a wgpu device (see [`exit`]).
#[cfg(feature = "wgpu")]
pub fn wgpu_starting() {
    WGPU_STARTED.store(true, Ordering::SeqCst);
}

/// The process's exit: `code`, and after a wgpu device without running the C libraries'
/// exit handlers. cubecl never destroys its devices, and its poll thread may still be
/// inside the driver when a Vulkan driver's library destructors run (CI saw a finished
/// `hla train --device wgpu` on Mesa's lavapipe end with a failure status and no message).
/// Every file is written by then; only the standard streams need flushing.
pub fn exit(code: u8) -> ExitCode {
    if WGPU_STARTED.load(Ordering::SeqCst) {
        exit_now(code)
    }
    ExitCode::from(code)
}

/// Ends the process now with `code`, as [`exit`] would end it.
pub fn exit_now(code: u8) -> ! {
    #[cfg(unix)]
    if WGPU_STARTED.load(Ordering::SeqCst) {
        // A failed flush (a closed pipe) changes nothing about how the run went.
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        // SAFETY: ends the process; no Rust state is used afterwards.
        unsafe { libc::_exit(code.into()) }
    }
    std::process::exit(code.into())
}
