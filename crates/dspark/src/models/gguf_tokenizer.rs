//! The tokenizer a GGUF file carries (`tokenizer.ggml.*`), as the `tokenizer.json` document
//! Hugging Face's `tokenizers` reads (the server's Rust crate and the Python package alike), so
//! a model given as one `.gguf` file needs nothing beside it.
//!
//! Two models, as llama.cpp's converter writes them:
//! - `gpt2`: byte-level BPE (Qwen's, GPT-2's): the tokens and `tokenizer.ggml.merges`, the
//!   pre-tokenizer's split regex chosen by `tokenizer.ggml.pre` (Qwen2's for `qwen2`, GPT-2's
//!   otherwise), byte-level decoding;
//! - `llama`: SentencePiece BPE: the tokens and their scores, merges derived from them (every
//!   split of a piece into two pieces, ranked by the piece's score, as SentencePiece merges the
//!   best-scored pair first), `▁` for spaces, byte fallback for `<0xNN>` tokens.
//!
//! Control tokens (type 3) and user-defined ones (type 4) become added tokens (special for
//! control ones), matched before the model splits text.

use serde_json::{Map, Value, json};

use crate::error::Result;
use crate::nn::gguf::{GgufFile, bad_gguf};

/// GGUF's token types.
const NORMAL: i64 = 1;
const UNKNOWN: i64 = 2;
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;
const BYTE: i64 = 6;

/// Qwen2's (and Qwen3's) split regex: contractions, letters with one leading non-letter,
/// single digits, punctuation runs, newlines, spaces.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The array of numbers at `key`, as f64 (`None` when absent).
fn numbers(f: &GgufFile, key: &str) -> Result<Option<Vec<f64>>> {
    use candle_core::quantized::gguf_file::Value as G;
    let Some(v) = f.value(key) else {
        return Ok(None);
    };
    let bad = || {
        bad_gguf(
            f.path(),
            None,
            format!("metadata `{key}` is not an array of numbers"),
        )
    };
    let G::Array(items) = v else {
        return Err(bad());
    };
    items
        .iter()
        .map(|v| match v {
            G::F32(x) => Ok(f64::from(*x)),
            G::F64(x) => Ok(*x),
            G::I32(x) => Ok(f64::from(*x)),
            G::U32(x) => Ok(f64::from(*x)),
            G::I64(x) => Ok(*x as f64),
            G::U8(x) => Ok(f64::from(*x)),
            G::I8(x) => Ok(f64::from(*x)),
            G::U16(x) => Ok(f64::from(*x)),
            G::I16(x) => Ok(f64::from(*x)),
            _ => Err(bad()),
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// The `tokenizer.json` document of the file's tokenizer. Errors: `bad-gguf` when the file has
/// none, or one of another model than `gpt2` and `llama`, or malformed token lists.
pub fn tokenizer_json(f: &GgufFile) -> Result<Value> {
    let model = f.string("tokenizer.ggml.model")?.ok_or_else(|| {
        bad_gguf(
            f.path(),
            None,
            "the file carries no tokenizer (tokenizer.ggml.model)",
        )
    })?;
    let tokens = f.strings("tokenizer.ggml.tokens")?.ok_or_else(|| {
        bad_gguf(
            f.path(),
            None,
            "metadata `tokenizer.ggml.tokens` is missing",
        )
    })?;
    let types = numbers(f, "tokenizer.ggml.token_type")?
        .map(|t| t.into_iter().map(|x| x as i64).collect::<Vec<_>>())
        .unwrap_or_else(|| vec![NORMAL; tokens.len()]);
    if types.len() != tokens.len() {
        return Err(bad_gguf(
            f.path(),
            None,
            format!("{} token types for {} tokens", types.len(), tokens.len()),
        ));
    }
    let added: Vec<Value> = tokens
        .iter()
        .zip(&types)
        .enumerate()
        .filter(|(_, (_, t))| matches!(**t, CONTROL | USER_DEFINED))
        .map(|(id, (text, t))| {
            json!({
                "id": id, "content": text, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": *t == CONTROL,
            })
        })
        .collect();
    let vocab: Map<String, Value> = tokens
        .iter()
        .enumerate()
        .map(|(id, t)| (t.to_string(), json!(id)))
        .collect();
    let mut doc = match model {
        "gpt2" => byte_level(f, vocab)?,
        "llama" => sentencepiece(f, &tokens, &types, vocab)?,
        other => {
            return Err(bad_gguf(
                f.path(),
                None,
                format!(
                    "tokenizer model `{other}`: dspark reads `gpt2` (byte-level BPE) and `llama` (SentencePiece BPE)"
                ),
            ));
        }
    };
    doc["version"] = json!("1.0");
    doc["truncation"] = Value::Null;
    doc["padding"] = Value::Null;
    doc["added_tokens"] = Value::Array(added);
    Ok(doc)
}

/// A byte-level BPE (`gpt2`).
fn byte_level(f: &GgufFile, vocab: Map<String, Value>) -> Result<Value> {
    let merges: Vec<Value> = f
        .strings("tokenizer.ggml.merges")?
        .unwrap_or_default()
        .into_iter()
        .map(|m| Value::String(m.to_string()))
        .collect();
    let byte_level = json!({
        "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false,
    });
    let pre = match f.string("tokenizer.ggml.pre")? {
        Some("qwen2") => json!({
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated",
                 "invert": false},
                byte_level,
            ],
        }),
        // GPT-2's own split, the byte-level pre-tokenizer's built-in regex.
        _ => json!({
            "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false,
            "use_regex": true,
        }),
    };
    Ok(json!({
        "normalizer": null,
        "pre_tokenizer": pre,
        "post_processor": null,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": merges,
        },
    }))
}

/// A SentencePiece BPE (`llama`).
fn sentencepiece(
    f: &GgufFile,
    tokens: &[&str],
    types: &[i64],
    vocab: Map<String, Value>,
) -> Result<Value> {
    let scores = numbers(f, "tokenizer.ggml.scores")?.unwrap_or_else(|| vec![0.0; tokens.len()]);
    if scores.len() != tokens.len() {
        return Err(bad_gguf(
            f.path(),
            None,
            format!("{} token scores for {} tokens", scores.len(), tokens.len()),
        ));
    }
    // Merges: every split of a normal piece into two pieces of the vocabulary, the best-scored
    // piece's first (ties: the lower id, then the earlier split). A character without a piece
    // of its own falls back to its bytes and merges no further (`tokenizers` merges pieces by
    // their text; SentencePiece vocabularies hold their characters as pieces).
    let id_of: std::collections::HashSet<&str> = tokens.iter().copied().collect();
    let mut merges: Vec<(f64, usize, usize, &str, &str)> = Vec::new();
    for (id, piece) in tokens.iter().enumerate() {
        if types[id] != NORMAL {
            continue;
        }
        for (at, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(at);
            if id_of.contains(l) && id_of.contains(r) {
                merges.push((scores[id], id, at, l, r));
            }
        }
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let merges: Vec<Value> = merges.iter().map(|m| json!([m.3, m.4])).collect();
    let unk = tokens
        .iter()
        .zip(types)
        .find(|(_, t)| **t == UNKNOWN)
        .map(|(t, _)| t.to_string());
    let prefix = !matches!(
        f.value("tokenizer.ggml.add_space_prefix"),
        Some(candle_core::quantized::gguf_file::Value::Bool(false))
    );
    let has_bytes = types.contains(&BYTE);
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    Ok(json!({
        "normalizer": null,
        "pre_tokenizer": {
            "type": "Metaspace", "replacement": "\u{2581}",
            "prepend_scheme": if prefix { "first" } else { "never" }, "split": false,
        },
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": unk.is_some(), "byte_fallback": has_bytes,
            "ignore_merges": false, "vocab": vocab, "merges": merges,
        },
    }))
}
