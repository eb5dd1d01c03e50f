//! The files a model directory holds beside its weights, as a GGUF file carries them inside:
//! `config.json` (from the architecture's metadata), `tokenizer.json` (from `tokenizer.ggml.*`,
//! [`super::gguf_tokenizer`]), `tokenizer_config.json` (the chat template and the special
//! tokens' text) and `generation_config.json` (the end-of-sequence id). A server or a CLI given
//! a `.gguf` file reads these instead of the directory's.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use serde_json::{Value, json};

use crate::config::TargetSpec;
use crate::error::{Result, Warning};
use crate::inspect::{InspectOptions, Report, inspect_with_target};
use crate::nn::gguf::GgufFile;

/// Whether `path` is a GGUF file (a file whose first bytes are GGUF's magic).
pub fn is_gguf(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    path.is_file()
        && std::fs::File::open(path).is_ok_and(|mut f| f.read_exact(&mut magic).is_ok())
        && &magic == b"GGUF"
}

/// The tensors of a GGUF file by type, in words: `Q6_K: 29 (token_embd.weight,
/// blk.N.attn_v.weight ×14, …)`, one type after another, float types last.
pub fn tensor_types(f: &GgufFile) -> String {
    let mut by: BTreeMap<(bool, &str), BTreeMap<String, usize>> = BTreeMap::new();
    for name in f.names() {
        let t = f.type_of(name).unwrap_or("?");
        let float = f.quant(name).is_none();
        // Layer numbers folded: `blk.3.attn_q.weight` is `blk.N.attn_q.weight`.
        let pattern = match name.strip_prefix("blk.").and_then(|r| r.split_once('.')) {
            Some((_, rest)) => format!("blk.N.{rest}"),
            None => name.to_string(),
        };
        *by.entry((float, t))
            .or_default()
            .entry(pattern)
            .or_default() += 1;
    }
    by.iter()
        .map(|((_, t), names)| {
            let total: usize = names.values().sum();
            let list: Vec<String> = names
                .iter()
                .map(|(n, &c)| {
                    if c > 1 {
                        format!("{n} ×{c}")
                    } else {
                        n.clone()
                    }
                })
                .collect();
            format!("{t}: {total} ({})", list.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// [`crate::inspect::inspect_with`], where the target may also be a GGUF file: its spec comes
/// from the file's metadata, and a `gguf-target` warning says which tensors are quantized, in
/// which type.
pub fn inspect_with(draft: &Path, target: Option<&Path>, options: &InspectOptions) -> Report {
    let Some(path) = target.filter(|p| is_gguf(p)) else {
        return crate::inspect::inspect_with(draft, target, options);
    };
    let file = match GgufFile::open(path) {
        Ok(f) => f,
        Err(e) => return inspect_with_target(draft, Some(Err(e)), options),
    };
    let spec = super::qwen3::gguf_config_json(&file)
        .and_then(|config| TargetSpec::from_value(&config, &path.display().to_string()));
    let mut report = inspect_with_target(draft, Some(spec), options);
    report.warnings.push(Warning::new(
        "gguf-target",
        format!(
            "{}: tensors by type: {}",
            path.display(),
            tensor_types(&file)
        ),
    ));
    report
}

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
        let tokens = f.strings("tokenizer.ggml.tokens")?.unwrap_or_default();
        let vocab = config["vocab_size"].as_u64().unwrap_or(0);
        let tokenizer = if tokens.len() as u64 > vocab {
            // Ids past the embedding's rows would be out of the model's (and its drafter's)
            // vocabulary.
            Err(format!(
                "{}: the tokenizer has {} tokens, more than the model's {vocab} embedding rows",
                path.display(),
                tokens.len()
            ))
        } else {
            super::gguf_tokenizer::tokenizer_json(&f).map_err(|e| e.to_string())
        };
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
