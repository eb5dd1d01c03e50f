//! Why the server could not start: one line, `dspark serve: error [CODE]: MESSAGE`, exit 1
//! (2 for usage errors), as every `dspark` command reports errors.

/// A startup failure with a stable code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("[{code}]: {message}")]
pub struct StartError {
    /// `usage`, `bind`, `tokenizer`, or a dspark error code.
    pub code: String,
    /// What went wrong.
    pub message: String,
}

impl StartError {
    /// An error with `code`.
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
        }
    }
}

impl From<dspark::Error> for StartError {
    fn from(e: dspark::Error) -> Self {
        Self::new(e.code(), e.to_string())
    }
}
