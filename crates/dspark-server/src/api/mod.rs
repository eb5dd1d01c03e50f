//! The HTTP API's types: request bodies and their checks, response bodies, OpenAI errors.

pub mod body;
pub mod chat;
pub mod completions;
pub mod error;
pub mod fields;
pub mod format;
pub mod logprobs;
pub mod penalties;
pub mod response;
mod shared;

pub(crate) use shared::GenerationBody;

pub use error::ApiError;
