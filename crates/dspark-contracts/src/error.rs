//! The one error type of the engine.
//!
//! Every variant has a stable machine code ([`Error::code`]) and belongs to one
//! [`ErrorKind`], which the Python bindings map to an exception class.

use std::path::PathBuf;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Coarse family of an error; the Python bindings raise one exception class per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A `config.json` is malformed or contradicts itself.
    Config,
    /// A checkpoint is missing, unreadable, or does not match its config.
    Checkpoint,
    /// Vocabulary sizes or the draft-to-target id map are inconsistent.
    Vocab,
    /// A caller passed an invalid argument (shape, dtype, range, non-finite value).
    Input,
    /// A failure inside the tensor backend.
    Backend,
    /// A bug in dspark itself (a caught panic): never the caller's fault.
    Internal,
}

/// Every error the engine reports.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A config value is missing, has the wrong type, or is out of range.
    #[error("{file}: `{key}`: {message}")]
    BadConfig {
        /// The config file (or `<dict>` for an in-memory config).
        file: String,
        /// The offending key, dotted for nested keys.
        key: String,
        /// What is wrong with it.
        message: String,
    },
    /// None of the five noise-token keys is present.
    #[error(
        "{file}: no noise (mask) token: set one of `dflash_config.mask_token_id`, `mask_token_id`, \
         `dspark_noise_token_id`, `pard_token` or `ptd_token_id`"
    )]
    NoNoiseToken {
        /// The config file.
        file: String,
    },
    /// The noise token id is outside the draft input vocabulary.
    #[error("{file}: `{key}` = {id} is outside the draft input vocabulary [0, {vocab_size})")]
    NoiseTokenOutOfRange {
        /// The config file.
        file: String,
        /// The key that supplied the id.
        key: String,
        /// The id found.
        id: i64,
        /// The draft input vocabulary size `V_in`.
        vocab_size: usize,
    },
    /// A file the checkpoint needs does not exist.
    #[error("{}: missing file ({what})", path.display())]
    MissingFile {
        /// The path looked for.
        path: PathBuf,
        /// What the file was needed for.
        what: String,
    },
    /// An I/O error other than a missing file.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path being read.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A safetensors file (or shard index) is malformed.
    #[error("{}: invalid safetensors: {message}", path.display())]
    BadSafetensors {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A GGUF file is malformed, truncated, or holds what dspark does not read (another
    /// architecture, an unsupported tensor type).
    #[error("{}: {}{message}", path.display(), tensor.as_ref().map_or(String::new(), |t| format!("tensor `{t}`: ")))]
    BadGguf {
        /// The file.
        path: PathBuf,
        /// The tensor (GGUF's name), when one is at fault.
        tensor: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// A tensor's shape differs from what the config implies.
    #[error("tensor `{tensor}` has shape {found:?}, the config implies {expected:?}")]
    ShapeMismatch {
        /// Checkpoint tensor name.
        tensor: String,
        /// Shape implied by the config.
        expected: Vec<usize>,
        /// Shape found in the checkpoint.
        found: Vec<usize>,
    },
    /// A required tensor is absent.
    #[error("required tensor `{tensor}` is missing: {reason}")]
    MissingTensor {
        /// Expected checkpoint tensor name.
        tensor: String,
        /// Why it is required.
        reason: String,
    },
    /// A tensor is present but has an unusable dtype.
    #[error("tensor `{tensor}` has dtype {dtype}, expected {expected}")]
    BadDtype {
        /// Checkpoint tensor name.
        tensor: String,
        /// The dtype found.
        dtype: String,
        /// What is accepted.
        expected: String,
    },
    /// A reduced-vocabulary drafter lacks its own `lm_head`.
    #[error(
        "reduced-vocabulary drafter (draft_vocab_size {draft} < target vocab {target}) must ship \
         `lm_head.weight`: the target lm_head cannot be shared"
    )]
    MissingLmHead {
        /// `V_d`.
        draft: usize,
        /// `V_t`.
        target: usize,
    },
    /// A reduced-vocabulary drafter lacks its `d2t` map.
    #[error(
        "reduced-vocabulary drafter (draft_vocab_size {draft} < target vocab {target}) must ship a \
         `d2t` tensor to map draft ids to target ids"
    )]
    MissingD2t {
        /// `V_d`.
        draft: usize,
        /// `V_t`.
        target: usize,
    },
    /// An expanded-input drafter lacks its own `embed_tokens`.
    #[error(
        "drafter input vocab_size {input} exceeds target vocab {target}: it must ship \
         `embed_tokens.weight`"
    )]
    MissingEmbedTokens {
        /// `V_in`.
        input: usize,
        /// `V_t`.
        target: usize,
    },
    /// `d2t` has the wrong length.
    #[error("d2t has {found} entries, draft_vocab_size is {expected}")]
    D2tWrongLength {
        /// `V_d`.
        expected: usize,
        /// Length found.
        found: usize,
    },
    /// `d2t` maps a draft id outside the target vocabulary.
    #[error(
        "d2t maps draft id {draft_id} to {target_id}, outside the target vocabulary [0, {target_vocab})"
    )]
    D2tOutOfRange {
        /// The draft id.
        draft_id: usize,
        /// The mapped id (`draft_id + d2t[draft_id]`).
        target_id: i64,
        /// `V_t`.
        target_vocab: usize,
    },
    /// Two draft ids map to one target id.
    #[error("d2t maps draft ids {first} and {second} to the same target id {target_id}")]
    D2tDuplicate {
        /// First draft id.
        first: usize,
        /// Second draft id.
        second: usize,
        /// The shared target id.
        target_id: usize,
    },
    /// The drafter does not fit the target model (layers, hidden size, vocab).
    #[error("drafter does not fit the target: {message}")]
    TargetMismatch {
        /// What does not fit.
        message: String,
    },
    /// Several problems at once (checkpoint validation reports all of them).
    #[error("{} problems: {}", .0.len(), .0.iter().map(|e| format!("[{}] {e}", e.code())).collect::<Vec<_>>().join("; "))]
    Multiple(Vec<Error>),
    /// A kernel argument has the wrong shape.
    #[error("bad shape for `{name}`: {message}")]
    BadShape {
        /// Argument name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// A kernel argument has an unsupported dtype.
    #[error("unsupported dtype for `{name}`: {message}")]
    UnsupportedDtype {
        /// Argument name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// A kernel argument holds NaN or infinite values where finite ones are required.
    #[error("`{name}` contains non-finite values ({message})")]
    NonFinite {
        /// Argument name.
        name: String,
        /// Where.
        message: String,
    },
    /// A token id is outside its vocabulary.
    #[error("`{name}` holds token id {id}, outside [0, {vocab_size})")]
    TokenOutOfRange {
        /// Argument name.
        name: String,
        /// The id.
        id: i64,
        /// The vocabulary size.
        vocab_size: usize,
    },
    /// Any other invalid argument value.
    #[error("invalid `{name}`: {message}")]
    InvalidArgument {
        /// Argument name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// A size derived from the arguments (an output, a config dimension, a file) is above
    /// its documented limit in [`crate::limits`]; refused before anything is allocated.
    #[error("`{name}` is too large: {size} exceeds the limit of {limit}{unit}")]
    TooLarge {
        /// The argument, key or file the size comes from.
        name: String,
        /// The size asked for (saturated at `u128::MAX` on overflow).
        size: u128,
        /// The documented limit.
        limit: u128,
        /// The unit, with a leading space (`" elements"`, `" bytes"`), or empty.
        unit: &'static str,
    },
    /// A tensor lives on a device this build or machine cannot use (a CUDA tensor reaching a
    /// build without the `cuda` feature, or a CUDA device that does not exist).
    #[error("`{name}` is on {device}, which is not available here: {message}")]
    DeviceUnavailable {
        /// Argument name.
        name: String,
        /// The device the tensor is on, e.g. `cuda:0`.
        device: String,
        /// Why it cannot be used.
        message: String,
    },
    /// The tensors of one call are on different devices.
    #[error("`{name}` is on {found}, but the call runs on {expected}")]
    DeviceMismatch {
        /// The argument on the other device.
        name: String,
        /// Its device.
        found: String,
        /// The device of the call (its first tensor argument, or the model's device).
        expected: String,
    },
    /// Code the engine calls back into (a target or drafter implemented outside the engine,
    /// a streaming callback) raised an error of its own. `source` is that error, unchanged: an
    /// embedder downcasts it to its own type (the Python bindings re-raise the user's
    /// exception). Wrong *outputs* of such code are `bad-shape` / `invalid-argument` errors
    /// naming the method instead.
    #[error("{context}: {source}")]
    Callback {
        /// The call that failed, e.g. `target.forward`.
        context: String,
        /// What it raised.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A bug in dspark: a panic caught at a public boundary, with its message.
    #[error("internal error (a bug in dspark, please report it): {message}")]
    Internal {
        /// The panic message, or what was caught.
        message: String,
    },
    /// The device ran out of memory (a CUDA allocation failed). Nothing the call computed is
    /// kept; the process and its device stay usable.
    #[error("out of device memory: {message}")]
    OutOfMemory {
        /// The backend's message.
        message: String,
    },
    /// An error from candle (with the `candle` feature, which the kernels crate turns on).
    #[cfg(feature = "candle")]
    #[error("tensor backend: {0}")]
    Candle(candle_core::Error),
}

#[cfg(feature = "candle")]
impl From<candle_core::Error> for Error {
    /// A candle error, as [`Error::OutOfMemory`] when it is a failed device allocation.
    fn from(e: candle_core::Error) -> Self {
        let text = e.to_string();
        if text.contains("OUT_OF_MEMORY") || text.contains("out of memory") {
            return Error::OutOfMemory { message: text };
        }
        Error::Candle(e)
    }
}

impl Error {
    /// The argument, field or tensor an input error names (`request.top_p`, `draft_tokens`),
    /// when it names one.
    pub fn argument(&self) -> Option<&str> {
        match self {
            Error::BadShape { name, .. }
            | Error::UnsupportedDtype { name, .. }
            | Error::NonFinite { name, .. }
            | Error::TokenOutOfRange { name, .. }
            | Error::InvalidArgument { name, .. }
            | Error::TooLarge { name, .. }
            | Error::DeviceUnavailable { name, .. }
            | Error::DeviceMismatch { name, .. } => Some(name),
            Error::ShapeMismatch { tensor, .. }
            | Error::MissingTensor { tensor, .. }
            | Error::BadDtype { tensor, .. } => Some(tensor),
            Error::BadGguf { tensor, .. } => tensor.as_deref(),
            Error::BadConfig { key, .. } | Error::NoiseTokenOutOfRange { key, .. } => Some(key),
            _ => None,
        }
    }

    /// The stable machine-readable code of this error, e.g. `"missing-d2t"`.
    pub fn code(&self) -> &'static str {
        match self {
            Error::BadConfig { .. } => "bad-config",
            Error::NoNoiseToken { .. } => "no-noise-token",
            Error::NoiseTokenOutOfRange { .. } => "noise-token-out-of-range",
            Error::MissingFile { .. } => "missing-file",
            Error::Io { .. } => "io",
            Error::BadSafetensors { .. } => "bad-safetensors",
            Error::BadGguf { .. } => "bad-gguf",
            Error::ShapeMismatch { .. } => "shape-mismatch",
            Error::MissingTensor { .. } => "missing-tensor",
            Error::BadDtype { .. } => "bad-dtype",
            Error::MissingLmHead { .. } => "missing-lm-head",
            Error::MissingD2t { .. } => "missing-d2t",
            Error::MissingEmbedTokens { .. } => "missing-embed-tokens",
            Error::D2tWrongLength { .. } => "d2t-wrong-length",
            Error::D2tOutOfRange { .. } => "d2t-out-of-range",
            Error::D2tDuplicate { .. } => "d2t-duplicate",
            Error::TargetMismatch { .. } => "target-mismatch",
            Error::Multiple(_) => "multiple",
            Error::BadShape { .. } => "bad-shape",
            Error::UnsupportedDtype { .. } => "unsupported-dtype",
            Error::NonFinite { .. } => "non-finite",
            Error::TokenOutOfRange { .. } => "token-out-of-range",
            Error::InvalidArgument { .. } => "invalid-argument",
            Error::TooLarge { .. } => "too-large",
            Error::DeviceUnavailable { .. } => "device-unavailable",
            Error::DeviceMismatch { .. } => "device-mismatch",
            Error::Internal { .. } => "internal",
            Error::Callback { .. } => "callback",
            Error::OutOfMemory { .. } => "out-of-memory",
            #[cfg(feature = "candle")]
            Error::Candle(_) => "backend",
        }
    }

    /// The family of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::BadConfig { .. }
            | Error::NoNoiseToken { .. }
            | Error::NoiseTokenOutOfRange { .. } => ErrorKind::Config,
            Error::MissingFile { .. }
            | Error::Io { .. }
            | Error::BadSafetensors { .. }
            | Error::BadGguf { .. }
            | Error::ShapeMismatch { .. }
            | Error::MissingTensor { .. }
            | Error::BadDtype { .. }
            | Error::MissingLmHead { .. }
            | Error::MissingEmbedTokens { .. }
            | Error::TargetMismatch { .. } => ErrorKind::Checkpoint,
            Error::MissingD2t { .. }
            | Error::D2tWrongLength { .. }
            | Error::D2tOutOfRange { .. }
            | Error::D2tDuplicate { .. } => ErrorKind::Vocab,
            Error::Multiple(errors) => errors.first().map_or(ErrorKind::Checkpoint, Error::kind),
            Error::BadShape { .. }
            | Error::UnsupportedDtype { .. }
            | Error::NonFinite { .. }
            | Error::TokenOutOfRange { .. }
            | Error::InvalidArgument { .. }
            | Error::TooLarge { .. }
            | Error::DeviceUnavailable { .. }
            | Error::DeviceMismatch { .. }
            | Error::Callback { .. } => ErrorKind::Input,
            Error::Internal { .. } => ErrorKind::Internal,
            Error::OutOfMemory { .. } => ErrorKind::Backend,
            #[cfg(feature = "candle")]
            Error::Candle(_) => ErrorKind::Backend,
        }
    }

    /// A [`Error::Callback`] for `context` carrying `source`.
    pub fn callback(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error::Callback {
            context: context.into(),
            source: source.into(),
        }
    }

    /// The individual problems: the inner list for [`Error::Multiple`], else `[self]`.
    pub fn problems(&self) -> Vec<&Error> {
        match self {
            Error::Multiple(errors) => errors.iter().flat_map(Error::problems).collect(),
            other => vec![other],
        }
    }

    /// Collapse a list of problems: `Ok(())` when empty, the error itself when there is one,
    /// [`Error::Multiple`] otherwise.
    pub fn collect(mut errors: Vec<Error>) -> Result<()> {
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(Error::Multiple(errors)),
        }
    }

    /// Shorthand for [`Error::BadConfig`].
    pub fn bad_config(
        file: impl Into<String>,
        key: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Error::BadConfig {
            file: file.into(),
            key: key.into(),
            message: message.into(),
        }
    }

    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(name: impl Into<String>, message: impl Into<String>) -> Self {
        Error::InvalidArgument {
            name: name.into(),
            message: message.into(),
        }
    }

    /// Shorthand for [`Error::TooLarge`].
    pub fn too_large(
        name: impl Into<String>,
        size: impl TryInto<u128>,
        limit: impl TryInto<u128>,
        unit: &'static str,
    ) -> Self {
        Error::TooLarge {
            name: name.into(),
            size: size.try_into().unwrap_or(u128::MAX),
            limit: limit.try_into().unwrap_or(u128::MAX),
            unit,
        }
    }

    /// Shorthand for [`Error::BadShape`].
    pub fn bad_shape(name: impl Into<String>, message: impl Into<String>) -> Self {
        Error::BadShape {
            name: name.into(),
            message: message.into(),
        }
    }
}

/// Run `f` and turn a panic inside it into [`Error::Internal`] (code `internal`) carrying the
/// panic message, so a bug in dspark surfaces as a typed error at a public boundary (the
/// Python glue wraps its calls in this) instead of unwinding into foreign code.
///
/// The engine validates its inputs, so a panic here is always a bug; the process's panic hook
/// still runs (and prints the message) before the error is returned. State `f` touched may be
/// half-updated (the closure is treated as unwind-safe), so callers should drop it. Builds with
/// `panic = "abort"` cannot catch anything and abort as before.
///
/// ```
/// use dspark_contracts::error::{Error, catch_panic};
/// let ok: dspark_contracts::Result<u32> = catch_panic(|| Ok(7));
/// assert_eq!(ok.unwrap(), 7);
/// let v: Vec<u32> = Vec::new();
/// let e = catch_panic(|| Ok(v[3])).unwrap_err();
/// assert_eq!(e.code(), "internal");
/// assert!(e.to_string().contains("index out of bounds"));
/// ```
pub fn catch_panic<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => Err(Error::Internal {
            message: panic_message(payload.as_ref()),
        }),
    }
}

/// The message of a panic payload (`&str` or `String`; anything else is described).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collect_keeps_single_error_as_is() {
        assert!(Error::collect(vec![]).is_ok());
        let one = Error::collect(vec![Error::MissingD2t {
            draft: 4,
            target: 8,
        }])
        .unwrap_err();
        assert_eq!(one.code(), "missing-d2t");
        let two = Error::collect(vec![
            Error::MissingD2t {
                draft: 4,
                target: 8,
            },
            Error::MissingLmHead {
                draft: 4,
                target: 8,
            },
        ])
        .unwrap_err();
        assert_eq!(two.code(), "multiple");
        let codes: Vec<_> = two.problems().iter().map(|e| e.code()).collect();
        assert_eq!(codes, ["missing-d2t", "missing-lm-head"]);
        assert!(two.to_string().contains("[missing-lm-head]"));
    }

    #[cfg(feature = "candle")]
    #[test]
    fn a_failed_device_allocation_is_out_of_memory() {
        let cuda = |m: &str| candle_core::Error::Cuda(m.to_string().into());
        let e = Error::from(cuda(
            "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")",
        ));
        assert_eq!((e.code(), e.kind()), ("out-of-memory", ErrorKind::Backend));
        let e = Error::from(cuda(
            "DriverError(CUDA_ERROR_INVALID_VALUE, \"invalid argument\")",
        ));
        assert_eq!((e.code(), e.kind()), ("backend", ErrorKind::Backend));
    }
}

/// A non-fatal finding: something loads, but not the way its author may expect.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Warning {
    /// Stable machine code, e.g. `"confidence-head-disabled"`.
    pub code: &'static str,
    /// Human-readable explanation.
    pub message: String,
}

impl Warning {
    /// Build a warning.
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}
