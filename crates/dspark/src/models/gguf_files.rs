//! The files a model directory holds beside its weights, as a GGUF file carries them inside:
//! `config.json` (from the architecture's metadata), `tokenizer.json` (from `tokenizer.ggml.*`,
//! [`super::gguf_tokenizer`]), `tokenizer_config.json` (the chat template and the special
//! tokens' text) and `generation_config.json` (the end-of-sequence id). A server or a CLI given
//! a `.gguf` file reads these instead of the directory's.

use std::path::Path;

use serde_json::{Value, json};

use crate::error::Result;
use crate::nn::gguf::GgufFile;

/// The side files of one GGUF file.
#[derive(Debug, Clone)]
pub struct SideFiles {
    /// `config.json`.
    pub config: Value,
    /// `tokenizer.json` (`Err`: the `bad-gguf` error saying why there is none).
    pub tokenizer: std::result::Result<Value, String>,
    /// `tokenizer_config.json`: `chat_template`, `bos_token`, `eos_token` where the file has
    /// them.
    pub tokenizer_config: Value,
    /// `generation_config.json`: `bos_token_id`, `eos_token_id` where the file has them.
    pub generation_config: Value,
}

impl SideFiles {
    /// Read them from the GGUF file at `path`. Errors: as [`GgufFile::open`], and `bad-gguf` for
    /// another architecture than Qwen3 or malformed metadata.
    pub fn read(path: &Path) -> Result<Self> {
        let f = GgufFile::open(path)?;
        let config = super::qwen3::gguf_config_json(&f)?;
        let tokenizer = super::gguf_tokenizer::tokenizer_json(&f).map_err(|e| e.to_string());
        let tokens = f.strings("tokenizer.ggml.tokens")?.unwrap_or_default();
        let text = |id: Option<u64>| {
            id.and_then(|i| tokens.get(usize::try_from(i).ok()?))
                .map(|t| t.to_string())
        };
        let (bos, eos) = (
            f.uint("tokenizer.ggml.bos_token_id")?,
            f.uint("tokenizer.ggml.eos_token_id")?,
        );
        let mut tokenizer_config = json!({});
        if let Some(t) = f.string("tokenizer.chat_template")? {
            tokenizer_config["chat_template"] = json!(t);
        }
        if let Some(t) = text(bos) {
            tokenizer_config["bos_token"] = json!(t);
        }
        if let Some(t) = text(eos) {
            tokenizer_config["eos_token"] = json!(t);
        }
        let mut generation_config = json!({});
        if let Some(id) = bos {
            generation_config["bos_token_id"] = json!(id);
        }
        if let Some(id) = eos {
            generation_config["eos_token_id"] = json!(id);
        }
        Ok(Self {
            config,
            tokenizer,
            tokenizer_config,
            generation_config,
        })
    }
}
