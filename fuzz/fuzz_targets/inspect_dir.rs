//! `dspark::inspect` on a random drafter directory: a config (fuzzed JSON values over a valid
//! base, or raw bytes), a target config, and a safetensors file (a header built from fuzzed
//! tensors, with claimed sizes up to the absurd and sparse data, or raw bytes), sometimes a
//! shard index. Inspect must return (never panic, never hang, never read what a header merely
//! claims), and every problem it reports must carry a known code.
#![no_main]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

const KNOWN: [&str; 17] = [
    "bad-config",
    "no-noise-token",
    "noise-token-out-of-range",
    "missing-file",
    "io",
    "bad-safetensors",
    "shape-mismatch",
    "missing-tensor",
    "bad-dtype",
    "missing-lm-head",
    "missing-d2t",
    "missing-embed-tokens",
    "d2t-wrong-length",
    "d2t-out-of-range",
    "d2t-duplicate",
    "target-mismatch",
    "too-large",
];

fn base_config() -> Value {
    json!({
        "architectures": ["Qwen3DSparkModel"],
        "block_size": 4,
        "target_layer_ids": [0, 1],
        "markov_rank": 2,
        "mask_token_id": 3,
        "vocab_size": 32,
        "draft_vocab_size": 16,
        "hidden_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 4,
        "intermediate_size": 16,
        "speculators_model_type": null
    })
}

const KEYS: [&str; 14] = [
    "vocab_size",
    "draft_vocab_size",
    "hidden_size",
    "target_hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "block_size",
    "markov_rank",
    "num_target_layers",
    "mask_token_id",
    "target_layer_ids",
];

fn number(u: &mut Unstructured<'_>) -> Result<Value> {
    Ok(match u.int_in_range(0u8..=9)? {
        0 => json!(u.arbitrary::<u64>()?),
        1 => json!(u.arbitrary::<i64>()?),
        2 => json!(1u64 << u.int_in_range(0u32..=63)?),
        3 => json!(f64::from(u.arbitrary::<f32>()?)),
        4 => json!(u.arbitrary::<bool>()?),
        5 => json!([0, u.arbitrary::<i64>()?]),
        6 => Value::Null,
        _ => json!(u.int_in_range(0u64..=40)?),
    })
}

fn config(u: &mut Unstructured<'_>) -> Result<Vec<u8>> {
    if u.ratio(1u8, 5)? {
        return u.arbitrary::<Vec<u8>>();
    }
    let mut v = base_config();
    for key in KEYS {
        if u.ratio(1u8, 3)? {
            v[key] = number(u)?;
        }
    }
    if u.ratio(1u8, 8)? {
        v["speculators_model_type"] = json!("dspark");
    }
    Ok(serde_json::to_vec(&v).unwrap_or_default())
}

const NAMES: [&str; 8] = [
    "d2t",
    "lm_head.weight",
    "embed_tokens.weight",
    "fc.weight",
    "markov_head.markov_w1.weight",
    "markov_head.markov_w2.weight",
    "layers.0.self_attn.q_proj.weight",
    "confidence_head.proj.weight",
];

/// A safetensors file: `(bytes written, extra sparse length)`.
fn safetensors(u: &mut Unstructured<'_>) -> Result<(Vec<u8>, u64)> {
    if u.ratio(1u8, 5)? {
        return Ok((u.arbitrary::<Vec<u8>>()?, 0));
    }
    let mut entries = Vec::new();
    let mut offset = 0u64;
    let mut payload = Vec::new();
    for _ in 0..u.int_in_range(0usize..=4)? {
        let name = NAMES[u.choose_index(NAMES.len())?];
        let dtype = *u.choose(&["I64", "I32", "BF16", "F32", "U8"])?;
        let width: u64 = match dtype {
            "I64" => 8,
            "I32" | "F32" => 4,
            "BF16" => 2,
            _ => 1,
        };
        let shape: Vec<u64> = (0..u.int_in_range(0usize..=2)?)
            .map(|_| {
                Ok(match u.int_in_range(0u8..=6)? {
                    0 => 1_000_000_000,
                    1 => u.arbitrary()?,
                    _ => u.int_in_range(0u64..=40)?,
                })
            })
            .collect::<Result<_>>()?;
        let len = shape.iter().fold(width, |a, &d| a.saturating_mul(d));
        let end = if u.ratio(1u8, 6)? {
            offset.saturating_add(u.arbitrary::<u16>()?.into())
        } else {
            offset.saturating_add(len)
        };
        entries.push(format!(
            "\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":{shape:?},\"data_offsets\":[{offset},{end}]}}"
        ));
        if end.saturating_sub(offset) <= 4096 {
            for _ in offset..end {
                payload.push(u.arbitrary::<u8>().unwrap_or(0));
            }
        }
        offset = end;
    }
    let header = format!("{{{}}}", entries.join(","));
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    let written = payload.len() as u64;
    bytes.extend(payload);
    // The rest of the claimed data is sparse (no disk), capped at 64 GiB.
    Ok((bytes, offset.saturating_sub(written).min(1 << 36)))
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

fn scratch_dir() -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("dspark-fuzz-inspect-{}-{n}", std::process::id()))
}

fn run(u: &mut Unstructured<'_>) -> Result<()> {
    let dir = scratch_dir();
    let draft = dir.join("draft");
    let target = dir.join("target");
    if std::fs::create_dir_all(&draft).is_err() || std::fs::create_dir_all(&target).is_err() {
        return Ok(());
    }
    let cfg = config(u)?;
    let tcfg = if u.arbitrary()? {
        serde_json::to_vec(&json!({
            "vocab_size": number(u)?,
            "num_hidden_layers": number(u)?,
            "hidden_size": 8,
        }))
        .unwrap_or_default()
    } else {
        br#"{"vocab_size": 32, "num_hidden_layers": 4, "hidden_size": 8}"#.to_vec()
    };
    let (st, sparse) = safetensors(u)?;
    let _ = std::fs::write(draft.join("config.json"), cfg);
    let _ = std::fs::write(target.join("config.json"), tcfg);
    let file = if u.ratio(1u8, 4)? {
        let index =
            json!({"weight_map": {"d2t": "shard.safetensors", "fc.weight": "shard.safetensors"}});
        let _ = std::fs::write(
            draft.join("model.safetensors.index.json"),
            serde_json::to_vec(&index).unwrap_or_default(),
        );
        draft.join("shard.safetensors")
    } else {
        draft.join("model.safetensors")
    };
    if std::fs::write(&file, &st).is_ok()
        && let Ok(f) = std::fs::OpenOptions::new().write(true).open(&file)
    {
        let _ = f.set_len(st.len() as u64 + sparse);
    }
    let with_target = u.arbitrary::<bool>()?;
    let report = dspark::inspect(&draft, with_target.then_some(target.as_path()));
    let _ = std::fs::remove_dir_all(&dir);
    for e in report.errors.iter().flat_map(|e| e.problems()) {
        assert!(
            KNOWN.contains(&e.code()),
            "untyped problem {}: {e}",
            e.code()
        );
    }
    let _ = report.to_json();
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});
