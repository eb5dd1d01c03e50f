//! `Inventory::open` + `LoadPlan::build` cost: it must depend on the number of tensors, not on
//! the size of their data. Three checkpoints: a 64-tensor Qwen3-shaped drafter as a ~2 MB file
//! and as a sparse multi-GB file (real 4B shapes, `set_len` to 8 GiB), and a ~2,000-tensor
//! DeepSeek-V4-sized inventory (`mtp.*` plus target-owned names).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::io::Write;
use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use dspark::config::ModelShape;
use dspark::config::spec::{MarkovHeadType, NoiseToken, NoiseTokenSource, RopeSpec};
use dspark::{ConfigFormat, DraftSpec, Inventory, LoadPlan, TargetSpec};

struct Dims {
    vocab: usize,
    h: usize,
    heads: usize,
    kv: usize,
    hd: usize,
    inter: usize,
    layers: usize,
    rank: usize,
}

const SMALL: Dims = Dims {
    vocab: 4096,
    h: 64,
    heads: 4,
    kv: 2,
    hd: 16,
    inter: 192,
    layers: 5,
    rank: 32,
};
/// `deepseek-ai/dspark_qwen3_4b_block7` shapes.
const QWEN3_4B: Dims = Dims {
    vocab: 151_936,
    h: 2560,
    heads: 32,
    kv: 8,
    hd: 128,
    inter: 9728,
    layers: 5,
    rank: 256,
};

fn spec(d: &Dims, format: ConfigFormat) -> DraftSpec {
    DraftSpec {
        source: "bench/config.json".into(),
        format,
        architecture: "Qwen3DSparkModel".into(),
        block_size: 7,
        sample_from_anchor: true,
        noise_token: NoiseToken {
            id: 0,
            source: NoiseTokenSource::MaskTokenId,
        },
        target_layer_ids: vec![1, 9, 17, 25, 33],
        capture_layer_ids: vec![2, 10, 18, 26, 34],
        num_target_layers: Some(36),
        markov_rank: d.rank,
        markov_head_type: MarkovHeadType::Vanilla,
        confidence_head: true,
        confidence_head_with_markov: true,
        shape: ModelShape {
            model_type: Some("qwen3".into()),
            vocab_size: d.vocab,
            hidden_size: d.h,
            num_hidden_layers: d.layers,
            num_attention_heads: d.heads,
            num_key_value_heads: d.kv,
            head_dim: d.hd,
            intermediate_size: d.inter,
            rms_norm_eps: 1e-6,
            rope: RopeSpec::neox(1e6),
            max_position_embeddings: Some(40960),
            hidden_act: "silu".into(),
            attention_bias: false,
            tie_word_embeddings: false,
        },
        draft_vocab_size: d.vocab,
        target_hidden_size: d.h,
        logit_scale: 1.0,
        final_logit_softcapping: None,
        warnings: Vec::new(),
    }
}

fn target(vocab: usize, h: usize) -> TargetSpec {
    TargetSpec {
        source: "bench/target.json".into(),
        vocab_size: vocab,
        num_hidden_layers: 36,
        hidden_size: h,
        model_type: None,
    }
}

/// The 64 tensors of a Qwen3 DSpark drafter (names as DeepSpec saves them).
fn qwen3_tensors(d: &Dims) -> Vec<(String, Vec<usize>)> {
    let (h, q, kv) = (d.h, d.heads * d.hd, d.kv * d.hd);
    let mut t: Vec<(String, Vec<usize>)> = vec![
        ("embed_tokens.weight".into(), vec![d.vocab, h]),
        ("lm_head.weight".into(), vec![d.vocab, h]),
        ("fc.weight".into(), vec![h, 5 * h]),
        ("hidden_norm.weight".into(), vec![h]),
        ("norm.weight".into(), vec![h]),
        ("markov_head.markov_w1.weight".into(), vec![d.vocab, d.rank]),
        ("markov_head.markov_w2.weight".into(), vec![d.vocab, d.rank]),
        ("confidence_head.proj.weight".into(), vec![1, h + d.rank]),
        ("confidence_head.proj.bias".into(), vec![1]),
    ];
    for i in 0..d.layers {
        for (n, s) in [
            ("self_attn.q_proj.weight", vec![q, h]),
            ("self_attn.k_proj.weight", vec![kv, h]),
            ("self_attn.v_proj.weight", vec![kv, h]),
            ("self_attn.o_proj.weight", vec![h, q]),
            ("self_attn.q_norm.weight", vec![d.hd]),
            ("self_attn.k_norm.weight", vec![d.hd]),
            ("mlp.gate_proj.weight", vec![d.inter, h]),
            ("mlp.up_proj.weight", vec![d.inter, h]),
            ("mlp.down_proj.weight", vec![h, d.inter]),
            ("input_layernorm.weight", vec![h]),
            ("post_attention_layernorm.weight", vec![h]),
        ] {
            t.push((format!("layers.{i}.{n}"), s));
        }
    }
    t
}

/// Write a BF16 safetensors file (header + zero data, sparse); the file is extended to at
/// least `min_len` bytes.
fn write(path: &Path, tensors: &[(String, Vec<usize>)], min_len: u64) {
    let mut offset = 0u64;
    let entries: Vec<String> = tensors
        .iter()
        .map(|(name, shape)| {
            let len = shape.iter().product::<usize>() as u64 * 2;
            let e = format!("\"{name}\":{{\"dtype\":\"BF16\",\"shape\":{shape:?},\"data_offsets\":[{offset},{}]}}", offset + len);
            offset += len;
            e
        })
        .collect();
    let header = format!("{{{}}}", entries.join(","));
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
    f.write_all(header.as_bytes()).unwrap();
    let end = 8 + header.len() as u64 + offset;
    if offset < 4 << 20 {
        // Small files are written for real.
        f.write_all(&vec![0u8; offset as usize]).unwrap();
    }
    f.set_len(end.max(min_len)).unwrap();
}

/// ~2,000 names of a DeepSeek-V4 checkpoint: three `mtp.*` stages (128 routed experts each)
/// plus the target's own layers.
fn dsv4_tensors(h: usize, vocab: usize, rank: usize) -> Vec<(String, Vec<usize>)> {
    let mut t: Vec<(String, Vec<usize>)> = vec![
        ("embed.weight".into(), vec![vocab, h]),
        ("head.weight".into(), vec![vocab, h]),
        ("norm.weight".into(), vec![h]),
        ("mtp.0.main_proj.weight".into(), vec![h, 5 * h]),
        ("mtp.0.main_norm.weight".into(), vec![h]),
        ("mtp.2.norm.weight".into(), vec![h]),
        ("mtp.2.hc_head_fn".into(), vec![4, 4 * h]),
        ("mtp.2.hc_head_base".into(), vec![4]),
        ("mtp.2.hc_head_scale".into(), vec![1]),
        (
            "mtp.2.markov_head.markov_w1.weight".into(),
            vec![vocab, rank],
        ),
        (
            "mtp.2.markov_head.markov_w2.weight".into(),
            vec![vocab, rank],
        ),
        (
            "mtp.2.confidence_head.proj.weight".into(),
            vec![1, h + rank],
        ),
    ];
    let layer = |prefix: &str, experts: usize, t: &mut Vec<(String, Vec<usize>)>| {
        for n in [
            "attn.wq_a.weight",
            "attn.wkv.weight",
            "attn.kv_norm.weight",
            "attn.wo_a.weight",
            "attn_norm.weight",
            "ffn_norm.weight",
            "ffn.gate.weight",
            "ffn.gate.bias",
        ] {
            t.push((format!("{prefix}.{n}"), vec![64, 64]));
        }
        for w in ["w1", "w2", "w3"] {
            t.push((
                format!("{prefix}.ffn.shared_experts.{w}.weight"),
                vec![256, h],
            ));
        }
        for e in 0..experts {
            for w in ["w1", "w2", "w3"] {
                t.push((format!("{prefix}.ffn.experts.{e}.{w}.weight"), vec![256, h]));
            }
        }
    };
    for s in 0..3 {
        layer(&format!("mtp.{s}"), 128, &mut t);
    }
    for l in 0..43 {
        layer(&format!("layers.{l}"), 6, &mut t);
    }
    t
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, std::path::PathBuf, DraftSpec, TargetSpec)> = {
        let small = dir.path().join("small");
        let big = dir.path().join("big");
        let dsv4 = dir.path().join("dsv4");
        for d in [&small, &big, &dsv4] {
            std::fs::create_dir(d).unwrap();
        }
        write(&small.join("model.safetensors"), &qwen3_tensors(&SMALL), 0);
        write(
            &big.join("model.safetensors"),
            &qwen3_tensors(&QWEN3_4B),
            8 << 30,
        );
        let (h, v, r) = (4096, 129_280, 256);
        write(&dsv4.join("model.safetensors"), &dsv4_tensors(h, v, r), 0);
        let mut dsv4_spec = spec(
            &Dims {
                vocab: v,
                h,
                heads: 64,
                kv: 1,
                hd: 512,
                inter: 2048,
                layers: 3,
                rank: r,
            },
            ConfigFormat::DeepSeekV4,
        );
        dsv4_spec.target_layer_ids = vec![40, 41, 42, 39, 38];
        vec![
            (
                "qwen3_64_tensors_2MB",
                small,
                spec(&SMALL, ConfigFormat::DeepSpec),
                target(SMALL.vocab, SMALL.h),
            ),
            (
                "qwen3_64_tensors_8GB_sparse",
                big,
                spec(&QWEN3_4B, ConfigFormat::DeepSpec),
                target(QWEN3_4B.vocab, QWEN3_4B.h),
            ),
            ("dsv4_2000_tensors", dsv4, dsv4_spec, target(v, h)),
        ]
    };
    let mut group = c.benchmark_group("inspect");
    for (name, path, spec, target) in &cases {
        let inv = Inventory::open(path).unwrap();
        let plan = LoadPlan::build(spec, target, &inv).unwrap();
        eprintln!(
            "{name}: {} tensors, {} files, {} loaded, {} target-owned, {} bytes on disk (logical {})",
            inv.len(),
            inv.files.len(),
            plan.tensors.len(),
            plan.target_owned,
            disk_bytes(path),
            std::fs::metadata(path.join("model.safetensors"))
                .unwrap()
                .len()
        );
        group.bench_function(*name, |b| {
            b.iter(|| {
                let inv = Inventory::open(black_box(path)).unwrap();
                black_box(LoadPlan::build(spec, target, &inv).unwrap())
            })
        });
    }
    group.finish();
}

fn disk_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir.join("model.safetensors")).map_or(0, |m| m.blocks() * 512)
}

criterion_group!(benches, bench);
criterion_main!(benches);
