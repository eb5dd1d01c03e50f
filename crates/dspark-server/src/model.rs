//! What the server knows about the served model besides the engine: its name, tokenizer,
//! chat template, end-of-sequence ids, vocabulary and context length, read from the target
//! directory.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;
use tokenizers::Tokenizer;

use crate::chat::ChatTemplate;
use crate::error::StartError;

/// Largest `config.json` / `generation_config.json` read: 16 MiB.
const MAX_CONFIG_BYTES: u64 = 16 << 20;
/// Largest `tokenizer.json` read: 512 MiB.
const MAX_TOKENIZER_BYTES: u64 = 512 << 20;

/// The served model, as the HTTP layer sees it.
#[derive(Debug)]
pub struct ModelInfo {
    /// The name clients use (`model`), and `/v1/models` lists.
    pub name: String,
    /// Unix seconds at start.
    pub created: u64,
    /// The target's tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// The chat template, or why there is none (the 400 `/v1/chat/completions` answers).
    pub chat: Result<ChatTemplate, String>,
    /// Ids that end a request unless it sets `ignore_eos`.
    pub eos_ids: Vec<u32>,
    /// The target vocabulary `V_t`.
    pub vocab_size: usize,
    /// Prompt plus completion tokens at most.
    pub max_model_len: usize,
    /// Bytes of text one token can stand for at most (its vocabulary's longest entry, in the
    /// UTF-8 of its own spelling, which is never shorter than the text it decodes to): a
    /// prompt longer than `max_model_len` times this cannot fit, whatever it says, and is
    /// refused before it is tokenized.
    pub max_token_bytes: usize,
    /// The tokenizer's tokens as log-probability entries show them.
    pub pieces: Arc<crate::logprobs::Pieces>,
    /// The grammar compiler of structured output, or why there is none.
    pub grammars: Result<Arc<crate::grammar::Grammars>, String>,
}

/// The longest vocabulary entry of `t` in bytes (at least 1).
fn longest_token(t: &Tokenizer) -> usize {
    t.get_vocab(true)
        .keys()
        .map(String::len)
        .max()
        .unwrap_or(1)
        .max(1)
}

fn read_json(path: &Path) -> Result<Option<Value>, StartError> {
    if !path.is_file() {
        return Ok(None);
    }
    let bytes = dspark::files::read_bounded(path, MAX_CONFIG_BYTES).map_err(|e| {
        StartError::new(
            "io",
            format!("{}: {}", path.display(), e.describe(MAX_CONFIG_BYTES)),
        )
    })?;
    serde_json::from_slice(&bytes).map(Some).map_err(|e| {
        StartError::new(
            "bad-config",
            format!("{}: invalid JSON: {e}", path.display()),
        )
    })
}

/// `eos_token_id` (an int or a list) of `generation_config.json`, else of `config.json`.
fn eos_ids(generation: Option<&Value>, config: &Value) -> Vec<u32> {
    let pick = |v: Option<&Value>| v?.get("eos_token_id").filter(|e| !e.is_null()).cloned();
    let ids = match pick(generation).or_else(|| pick(Some(config))) {
        Some(Value::Array(v)) => v,
        Some(v) => vec![v],
        None => Vec::new(),
    };
    ids.iter()
        .filter_map(Value::as_u64)
        .filter_map(|x| u32::try_from(x).ok())
        .collect()
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The files the server reads beside the weights: from the target directory, or as a GGUF
/// file carries them.
struct Files {
    config: Value,
    generation: Option<Value>,
    /// `tokenizer.json`'s bytes, and what to call it in errors.
    tokenizer: (Vec<u8>, String),
    chat: Result<Option<ChatTemplate>, String>,
}

impl Files {
    /// `config.json`, `generation_config.json`, `tokenizer.json` and the chat template of `dir`.
    fn of_dir(dir: &Path) -> Result<Self, StartError> {
        let config = read_json(&dir.join("config.json"))?.ok_or_else(|| {
            StartError::new("missing-file", format!("{}: no config.json", dir.display()))
        })?;
        let generation = read_json(&dir.join("generation_config.json"))?;
        let tokenizer_path = dir.join("tokenizer.json");
        let bytes =
            dspark::files::read_bounded(&tokenizer_path, MAX_TOKENIZER_BYTES).map_err(|e| {
                StartError::new(
                    "tokenizer",
                    format!(
                        "{}: {} (the server needs the target's fast tokenizer)",
                        tokenizer_path.display(),
                        e.describe(MAX_TOKENIZER_BYTES)
                    ),
                )
            })?;
        Ok(Self {
            config,
            generation,
            tokenizer: (bytes, tokenizer_path.display().to_string()),
            chat: ChatTemplate::from_dir(dir),
        })
    }

    /// The same, as the GGUF file `path` carries them
    /// ([`dspark::models::gguf_files::SideFiles`]).
    fn of_gguf(path: &Path) -> Result<Self, StartError> {
        let side = dspark::models::gguf_files::SideFiles::read(path)?;
        let tokenizer = side
            .tokenizer
            .map_err(|e| StartError::new("tokenizer", e))?;
        let label = format!("{} (its tokenizer)", path.display());
        Ok(Self {
            chat: ChatTemplate::from_config(&side.tokenizer_config, || Ok(None), &label),
            config: side.config,
            generation: Some(side.generation_config),
            tokenizer: (tokenizer.to_string().into_bytes(), label),
        })
    }
}

impl ModelInfo {
    /// Read the target directory `dir`: `config.json` (`vocab_size`,
    /// `max_position_embeddings`), `generation_config.json` (`eos_token_id`),
    /// `tokenizer.json`, and the chat template (`tokenizer_config.json`); or what a GGUF file
    /// `dir` carries in their place. `name` defaults to the directory's (or file's) name;
    /// `max_model_len` to `max_position_embeddings`.
    pub fn load(
        dir: &Path,
        name: Option<String>,
        max_model_len: Option<usize>,
    ) -> Result<Self, StartError> {
        let files = if dir.is_file() {
            Files::of_gguf(dir)?
        } else {
            Files::of_dir(dir)?
        };
        let (config, generation) = (&files.config, files.generation.as_ref());
        let positive = |key: &str| -> Option<usize> {
            config
                .get(key)?
                .as_u64()
                .filter(|&v| v > 0)
                .and_then(|v| usize::try_from(v).ok())
        };
        let vocab_size = positive("vocab_size").ok_or_else(|| {
            StartError::new(
                "bad-config",
                format!("{}/config.json: no positive vocab_size", dir.display()),
            )
        })?;
        let max_model_len = match (max_model_len, positive("max_position_embeddings")) {
            (Some(n), _) | (None, Some(n)) => n,
            (None, None) => {
                return Err(StartError::new(
                    "bad-config",
                    format!(
                        "{}/config.json has no max_position_embeddings: give --max-model-len",
                        dir.display()
                    ),
                ));
            }
        };
        let (bytes, tokenizer_label) = &files.tokenizer;
        let tokenizer = Tokenizer::from_bytes(bytes)
            .map_err(|e| StartError::new("tokenizer", format!("{tokenizer_label}: {e}")))?;
        let chat = match files.chat {
            Ok(Some(t)) => Ok(t),
            Ok(None) => Err(format!(
                "this model has no chat template (no chat_template in {}/tokenizer_config.json): \
                 use /v1/completions",
                dir.display()
            )),
            Err(e) => return Err(StartError::new("bad-config", e)),
        };
        let name = name.unwrap_or_else(|| {
            dir.file_name()
                .map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned())
        });
        let max_token_bytes = longest_token(&tokenizer);
        let eos_ids = eos_ids(generation, config);
        let grammars = match (serde_json::from_slice::<Value>(bytes), eos_ids.first()) {
            (Ok(json), Some(&eos)) => {
                crate::grammar::Grammars::new(&json, vocab_size, eos).map(Arc::new)
            }
            (Err(e), _) => Err(format!("tokenizer.json: {e}")),
            (_, None) => Err("the model has no end-of-sequence id".into()),
        };
        Ok(Self {
            name,
            created: unix_now(),
            max_token_bytes,
            pieces: Arc::new(crate::logprobs::Pieces::new(&tokenizer)),
            tokenizer: Arc::new(tokenizer),
            chat,
            eos_ids,
            grammars,
            vocab_size,
            max_model_len,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn eos_from_generation_config_first() {
        let config = json!({"eos_token_id": 1});
        assert_eq!(eos_ids(None, &config), [1]);
        assert_eq!(
            eos_ids(Some(&json!({"eos_token_id": [2, 3]})), &config),
            [2, 3]
        );
        assert_eq!(eos_ids(Some(&json!({"eos_token_id": null})), &config), [1]);
        assert!(eos_ids(None, &json!({})).is_empty());
    }
}
