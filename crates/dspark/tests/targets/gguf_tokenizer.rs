//! What a GGUF file carries beside its tensors (`SideFiles`): the tokenizer, as a
//! `tokenizer.json` that encodes as the original does (byte-level BPE: the bundled pair's own
//! tokenizer, written into a file the way llama.cpp's converter writes it), or as SentencePiece
//! merges its best-scored pair first; the config, chat template and special tokens.
use std::path::Path;

use candle_core::quantized::gguf_file::Value as G;
use dspark::models::gguf_files::SideFiles;
use serde_json::Value;
use tokenizers::Tokenizer;

use crate::targets_common::Tiny;
use crate::targets_common::gguf::{Kind, write_gguf};

fn strings(v: &[&str]) -> G {
    G::Array(v.iter().map(|s| G::String(s.to_string())).collect())
}

/// A tiny model's GGUF file (a vocabulary of `vocab`) with `meta` added, and its side files.
fn side_of(dir: &Path, vocab: usize, meta: &[(&str, G)]) -> SideFiles {
    let t = Tiny {
        vocab,
        rows: vocab,
        ..Tiny::default()
    };
    let path = dir.join("m.gguf");
    write_gguf(&t.config(), &t.tensors(), &path, |_, _| Kind::F32, meta);
    SideFiles::read(&path).unwrap()
}

/// [`side_of`] with a vocabulary of 50.
fn side(dir: &Path, meta: &[(&str, G)]) -> SideFiles {
    side_of(dir, 50, meta)
}

fn tokenizer(s: &SideFiles) -> Tokenizer {
    let json = serde_json::to_vec(s.tokenizer.as_ref().unwrap()).unwrap();
    Tokenizer::from_bytes(json).unwrap()
}

const TEXTS: [&str; 4] = [
    "Hello world, this is a test of 123 tokens.",
    "  two  spaces\nand a newline\n\n",
    "naïve café — ünïcödé 42!",
    "<|endoftext|>after the end",
];

#[test]
fn a_byte_level_bpe_encodes_as_the_tokenizer_it_was_written_from() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../python/dspark/models/tiny/target/tokenizer.json");
    let original = Tokenizer::from_file(&path).unwrap();
    let json: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let vocab = json["model"]["vocab"].as_object().unwrap();
    let mut tokens = vec![""; vocab.len()];
    for (t, id) in vocab {
        tokens[id.as_u64().unwrap() as usize] = t;
    }
    let merges: Vec<String> = json["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Value::String(s) => s.clone(),
            Value::Array(p) => format!("{} {}", p[0].as_str().unwrap(), p[1].as_str().unwrap()),
            other => panic!("{other}"),
        })
        .collect();
    let special: Vec<u64> = json["added_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_u64().unwrap())
        .collect();
    let types: Vec<G> = (0..tokens.len())
        .map(|i| G::I32(if special.contains(&(i as u64)) { 3 } else { 1 }))
        .collect();
    let merge_refs: Vec<&str> = merges.iter().map(String::as_str).collect();
    // The side files of a byte-level BPE of this vocabulary split by `pre`, with `extra` keys.
    let bpe = |pre: &str, extra: &[(&str, G)]| {
        let mut meta = vec![
            ("tokenizer.ggml.model", G::String("gpt2".into())),
            ("tokenizer.ggml.pre", G::String(pre.into())),
            ("tokenizer.ggml.tokens", strings(&tokens)),
            ("tokenizer.ggml.token_type", G::Array(types.clone())),
            ("tokenizer.ggml.merges", strings(&merge_refs)),
        ];
        meta.extend_from_slice(extra);
        let dir = tempfile::tempdir().unwrap();
        side_of(dir.path(), tokens.len(), &meta)
    };
    let template = G::String("{{ messages }}".into());
    let s = bpe(
        "default",
        &[
            ("tokenizer.ggml.eos_token_id", G::U32(0)),
            ("tokenizer.chat_template", template),
        ],
    );
    let ours = tokenizer(&s);
    for text in TEXTS {
        let want = original.encode(text, false).unwrap();
        let got = ours.encode(text, false).unwrap();
        assert_eq!(got.get_ids(), want.get_ids(), "{text:?}");
        assert_eq!(ours.decode(got.get_ids(), false).unwrap(), text);
    }
    assert_eq!(s.tokenizer_config["eos_token"], "<|endoftext|>");
    assert_eq!(s.tokenizer_config["chat_template"], "{{ messages }}");
    assert_eq!(s.generation_config["eos_token_id"], 0);
    assert_eq!(s.config["model_type"], "qwen3");

    // Qwen2's split regex (`pre = qwen2`) makes a working tokenizer of the same vocabulary.
    let s = bpe("qwen2", &[]);
    let qwen = tokenizer(&s);
    for text in TEXTS {
        let ids = qwen.encode(text, false).unwrap();
        assert_eq!(qwen.decode(ids.get_ids(), false).unwrap(), text);
    }
}

#[test]
fn a_sentencepiece_vocabulary_merges_its_best_scored_pair_first() {
    let tokens = [
        "<unk>",
        "<s>",
        "</s>",
        "<0x0A>",
        "\u{2581}",
        "a",
        "b",
        "c",
        "\u{2581}a",
        "ab",
        "\u{2581}ab",
        "bc",
        "abc",
    ];
    let scores = [
        0.0, 0.0, 0.0, 0.0, -5.0, -6.0, -6.0, -6.0, -1.0, -2.0, -0.5, -3.0, -0.1,
    ];
    let types = [2, 3, 3, 6, 1, 1, 1, 1, 1, 1, 1, 1, 1];
    let dir = tempfile::tempdir().unwrap();
    let s = side(
        dir.path(),
        &[
            ("tokenizer.ggml.model", G::String("llama".into())),
            ("tokenizer.ggml.tokens", strings(&tokens)),
            (
                "tokenizer.ggml.scores",
                G::Array(scores.iter().map(|&x| G::F32(x)).collect()),
            ),
            (
                "tokenizer.ggml.token_type",
                G::Array(types.iter().map(|&x| G::I32(x)).collect()),
            ),
            ("tokenizer.ggml.bos_token_id", G::U32(1)),
            ("tokenizer.ggml.eos_token_id", G::U32(2)),
        ],
    );
    let tok = tokenizer(&s);
    let piece =
        |text: &str| -> Vec<String> { tok.encode(text, false).unwrap().get_tokens().to_vec() };
    // "▁a" first (−1), then "▁ab" (−0.5): never "abc" across a word boundary.
    assert_eq!(piece("ab abc"), ["\u{2581}ab", "\u{2581}ab", "c"]);
    assert_eq!(piece("abc"), ["\u{2581}ab", "c"]);
    // A newline has no piece: its byte token; the text comes back.
    let ids = tok.encode("ab\nc", false).unwrap();
    assert!(
        ids.get_tokens().contains(&"<0x0A>".to_string()),
        "{:?}",
        ids.get_tokens()
    );
    assert_eq!(tok.decode(ids.get_ids(), false).unwrap(), "ab\nc");
    assert_eq!(s.tokenizer_config["bos_token"], "<s>");
    assert_eq!(s.tokenizer_config["eos_token"], "</s>");
}

#[test]
fn a_file_without_a_tokenizer_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let s = side(dir.path(), &[]);
    let e = s.tokenizer.unwrap_err();
    assert!(e.contains("tokenizer") && e.contains("m.gguf"), "{e}");
    let s = side(
        dir.path(),
        &[
            ("tokenizer.ggml.model", G::String("bert".into())),
            ("tokenizer.ggml.tokens", strings(&["a"])),
        ],
    );
    assert!(s.tokenizer.unwrap_err().contains("bert"));
    // More tokens than the model has embedding rows (the tiny model's vocabulary is 50).
    let many: Vec<String> = (0..60).map(|i| format!("t{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let s = side(
        dir.path(),
        &[
            ("tokenizer.ggml.model", G::String("gpt2".into())),
            ("tokenizer.ggml.tokens", strings(&many)),
        ],
    );
    let e = s.tokenizer.unwrap_err();
    assert!(e.contains("60 tokens") && e.contains("50"), "{e}");
}
