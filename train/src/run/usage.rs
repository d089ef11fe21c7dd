//! Usage errors: a mistake in how `hla` was called or configured exits with status 2, as
//! clap's own do; any other failure with 1.

/// A mistake in how the command was called or configured (exit status 2), as opposed to
/// a failure while running (exit status 1).
#[derive(Debug)]
pub struct UsageError(anyhow::Error);

impl From<anyhow::Error> for UsageError {
    fn from(error: anyhow::Error) -> Self {
        Self(error)
    }
}

/// `message` as a usage error.
pub fn usage(message: impl std::fmt::Display) -> anyhow::Error {
    UsageError(anyhow::Error::msg(message.to_string())).into()
}

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for UsageError {}
