//! Shared helpers for the checkpoint tests: tiny specs and safetensors writers.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::{Path, PathBuf};

use dspark::config::ModelShape;
use dspark::config::spec::{MarkovHeadType, NoiseToken, NoiseTokenSource, RopeSpec};
use dspark::{ConfigFormat, DraftSpec, TargetSpec};

/// Draft hidden size of the tiny test drafters.
pub const H: usize = 8;
/// Heads, KV heads, head dim, intermediate size, rank, captured layers.
pub const HEADS: usize = 2;
pub const KV: usize = 1;
pub const HD: usize = 4;
pub const INTER: usize = 16;
pub const RANK: usize = 4;
pub const LAYERS: usize = 2;
pub const TARGET_LAYERS: usize = 3;

/// A Qwen3-shaped DeepSpec drafter with `V_in = vocab`, `V_d = draft_vocab`.
pub fn qwen3_spec(vocab: usize, draft_vocab: usize) -> DraftSpec {
    DraftSpec {
        source: "draft/config.json".into(),
        format: ConfigFormat::DeepSpec,
        architecture: "Qwen3DSparkModel".into(),
        block_size: 7,
        sample_from_anchor: true,
        noise_token: NoiseToken {
            id: 0,
            source: NoiseTokenSource::MaskTokenId,
        },
        target_layer_ids: vec![1, 4, 7],
        capture_layer_ids: vec![2, 5, 8],
        num_target_layers: Some(10),
        markov_rank: RANK,
        markov_head_type: MarkovHeadType::Vanilla,
        confidence_head: true,
        confidence_head_with_markov: true,
        shape: ModelShape {
            model_type: Some("qwen3".into()),
            vocab_size: vocab,
            hidden_size: H,
            num_hidden_layers: LAYERS,
            num_attention_heads: HEADS,
            num_key_value_heads: KV,
            head_dim: HD,
            intermediate_size: INTER,
            rms_norm_eps: 1e-6,
            rope: RopeSpec::neox(1e6),
            max_position_embeddings: Some(4096),
            hidden_act: "silu".into(),
            attention_bias: false,
            tie_word_embeddings: false,
        },
        draft_vocab_size: draft_vocab,
        target_hidden_size: H,
        logit_scale: 1.0,
        final_logit_softcapping: None,
        warnings: Vec::new(),
    }
}

/// A DeepSeek-V4 drafter with `stages` MTP stages over a vocabulary of `vocab`.
pub fn dsv4_spec(vocab: usize, stages: usize) -> DraftSpec {
    let base = qwen3_spec(vocab, vocab);
    DraftSpec {
        format: ConfigFormat::DeepSeekV4,
        architecture: "DeepseekV4ForCausalLM".into(),
        noise_token: NoiseToken {
            id: 0,
            source: NoiseTokenSource::DsparkNoiseTokenId,
        },
        shape: ModelShape {
            model_type: Some("deepseek_v4".into()),
            num_hidden_layers: stages,
            ..base.shape.clone()
        },
        ..base
    }
}

/// A target with a logical vocabulary of `vocab` ids.
pub fn target(vocab: usize) -> TargetSpec {
    TargetSpec {
        source: "target/config.json".into(),
        vocab_size: vocab,
        num_hidden_layers: 10,
        hidden_size: H,
        model_type: Some("qwen3".into()),
    }
}

/// One tensor to write: name, dtype, shape and (optionally) its bytes (zeros otherwise).
#[derive(Debug, Clone)]
pub struct T {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<usize>,
    pub data: Option<Vec<u8>>,
}

/// A BF16 tensor of zeros.
pub fn bf16(name: &str, shape: &[usize]) -> T {
    T {
        name: name.into(),
        dtype: "BF16",
        shape: shape.to_vec(),
        data: None,
    }
}

/// An I64 tensor holding `values`.
pub fn i64s(name: &str, values: &[i64]) -> T {
    T {
        name: name.into(),
        dtype: "I64",
        shape: vec![values.len()],
        data: Some(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
    }
}

fn bytes_of(t: &T) -> u64 {
    let bits = match t.dtype {
        "I64" | "F64" | "U64" => 64,
        "I32" | "F32" | "U32" => 32,
        "BF16" | "F16" | "I16" | "U16" => 16,
        _ => 8,
    };
    t.shape.iter().product::<usize>() as u64 * bits / 8
}

/// Build a header JSON for `tensors` laid out back to back; returns it and the data length.
pub fn header_json(tensors: &[T]) -> (String, u64) {
    let mut offset = 0u64;
    let mut entries = Vec::new();
    for t in tensors {
        let len = bytes_of(t);
        entries.push(format!(
            "\"{}\":{{\"dtype\":\"{}\",\"shape\":{:?},\"data_offsets\":[{},{}]}}",
            t.name,
            t.dtype,
            t.shape,
            offset,
            offset + len
        ));
        offset += len;
    }
    (format!("{{{}}}", entries.join(",")), offset)
}

/// Write a raw safetensors file: prefix, `header` bytes, then `data_len` bytes of data
/// (sparse: the file is extended with `set_len`, costing no disk).
pub fn write_raw(path: &Path, header: &[u8], data_len: u64) {
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
    f.write_all(header).unwrap();
    f.set_len(8 + header.len() as u64 + data_len).unwrap();
}

/// Write a valid safetensors file holding `tensors` (data zero unless given).
pub fn write_st(path: &Path, tensors: &[T]) {
    let (header, data_len) = header_json(tensors);
    write_raw(path, header.as_bytes(), data_len);
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let mut offset = 8 + header.len() as u64;
    for t in tensors {
        if let Some(data) = &t.data {
            use std::io::{Seek, SeekFrom};
            f.seek(SeekFrom::Start(offset)).unwrap();
            f.write_all(data).unwrap();
        }
        offset += bytes_of(t);
    }
}

/// Every tensor a complete Qwen3-shaped drafter for `spec` ships, checkpoint names (no
/// `model.` prefix), with embed and lm_head.
pub fn qwen3_tensors(spec: &DraftSpec) -> Vec<T> {
    let (h, q, kv) = (spec.shape.hidden_size, HEADS * HD, KV * HD);
    let mut out = vec![
        bf16("embed_tokens.weight", &[spec.shape.vocab_size, h]),
        bf16("lm_head.weight", &[spec.draft_vocab_size, h]),
        bf16("fc.weight", &[h, TARGET_LAYERS * h]),
        bf16("hidden_norm.weight", &[h]),
        bf16("norm.weight", &[h]),
        bf16(
            "markov_head.markov_w1.weight",
            &[spec.shape.vocab_size, spec.markov_rank],
        ),
        bf16(
            "markov_head.markov_w2.weight",
            &[spec.draft_vocab_size, spec.markov_rank],
        ),
        bf16("confidence_head.proj.weight", &[1, h + spec.markov_rank]),
        bf16("confidence_head.proj.bias", &[1]),
    ];
    for i in 0..spec.shape.num_hidden_layers {
        let l = |n: &str, s: &[usize]| bf16(&format!("layers.{i}.{n}"), s);
        out.extend([
            l("self_attn.q_proj.weight", &[q, h]),
            l("self_attn.k_proj.weight", &[kv, h]),
            l("self_attn.v_proj.weight", &[kv, h]),
            l("self_attn.o_proj.weight", &[h, q]),
            l("self_attn.q_norm.weight", &[HD]),
            l("self_attn.k_norm.weight", &[HD]),
            l("mlp.gate_proj.weight", &[INTER, h]),
            l("mlp.up_proj.weight", &[INTER, h]),
            l("mlp.down_proj.weight", &[h, INTER]),
            l("input_layernorm.weight", &[h]),
            l("post_attention_layernorm.weight", &[h]),
        ]);
    }
    out
}

/// `tensors` without the ones named.
pub fn without(tensors: Vec<T>, names: &[&str]) -> Vec<T> {
    tensors
        .into_iter()
        .filter(|t| !names.contains(&t.name.as_str()))
        .collect()
}

/// Replace the shape of tensor `name`.
pub fn reshape(mut tensors: Vec<T>, name: &str, shape: &[usize]) -> Vec<T> {
    for t in &mut tensors {
        if t.name == name {
            t.shape = shape.to_vec();
        }
    }
    tensors
}

/// A temp dir with `model.safetensors` holding `tensors`; returns the dir guard and its path.
pub fn checkpoint_dir(tensors: &[T]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    write_st(&dir.path().join("model.safetensors"), tensors);
    let path = dir.path().to_path_buf();
    (dir, path)
}

/// The machine codes of an error's problems, sorted.
pub fn codes(e: &dspark::Error) -> Vec<&'static str> {
    let mut c: Vec<_> = e.problems().iter().map(|p| p.code()).collect();
    c.sort_unstable();
    c
}

/// The warning codes of a plan.
pub fn warning_codes(plan: &dspark::LoadPlan) -> Vec<&'static str> {
    plan.warnings.iter().map(|w| w.code).collect()
}

/// The load plan of `spec` over a checkpoint of `tensors` for a target of `v_t` ids.
pub fn plan(spec: &DraftSpec, v_t: usize, tensors: &[T]) -> dspark::Result<dspark::LoadPlan> {
    let (_g, dir) = checkpoint_dir(tensors);
    let inv = dspark::Inventory::open(&dir)?;
    let plan = dspark::LoadPlan::build(spec, &target(v_t), &inv);
    if let Ok(p) = &plan {
        // Every checkpoint tensor is either loaded or deliberately ignored.
        assert_eq!(
            p.tensors.len() + p.ignored.len() + p.target_owned,
            inv.len()
        );
    }
    plan
}
