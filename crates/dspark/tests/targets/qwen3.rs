//! The native Qwen3 target: loading (dtypes, shards, typed errors), the TargetModel contract
//! suite on random and on the bundled checkpoint, and agreement with HF transformers.
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::drafter_common::Rng;
use crate::targets_common::Tiny;
use candle_core::{DType, Device, Tensor};
use dspark::models::qwen3::{Qwen3Cache, Qwen3Target};
use dspark::speculator::contract::check_target;
use dspark::speculator::{LogitRows, TargetInput, TargetModel};
use dspark::{Drafter, Qwen3Drafter};
use serde_json::{Value, json};

/// A bad forward: what is wrong (or the expected code), tokens, width, num_tokens, capture ids.
type Case<'a> = (&'a str, &'a [u32], usize, &'a [usize], &'a [usize]);

fn bundled_dir() -> PathBuf {
    crate::targets_common::bundled_dir().join("target")
}

/// The bundled target with an f32 KV cache: the function HF transformers computes in f32 (the
/// default f16 cache rounds keys and values, `kv_dtype.rs`).
fn bundled() -> Qwen3Target {
    let options = dspark::LoadOptions {
        kv_dtype: Some(dspark::WeightDtype::F32),
        ..Default::default()
    };
    Qwen3Target::load_with(&bundled_dir(), &Device::Cpu, options).unwrap()
}

fn host(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// One forward of a single request.
fn step(t: &Qwen3Target, cache: &mut Qwen3Cache, tokens: &[u32], rows: LogitRows) -> Vec<f32> {
    let input = TargetInput {
        tokens,
        width: tokens.len(),
        num_tokens: &[tokens.len()],
        logits: rows,
    };
    host(&t.forward(cache, &input, &[]).unwrap().logits)
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best as u32
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn contract_f32_single_file_padded_vocab() {
    let (_dir, t) = Tiny::default().load();
    assert_eq!(
        (t.vocab_size(), t.num_hidden_layers(), t.hidden_size()),
        (50, 3, 16)
    );
    check_target(&t, &[0, 2]).unwrap();
    check_target(&t, &[]).unwrap();
}

#[test]
fn contract_bf16_sharded_tied_with_bias() {
    let tiny = Tiny {
        dtype: "bf16",
        sharded: true,
        tie: true,
        bias: true,
        heads: 2,
        kv: 2,
        rows: 50,
        seed: 11,
        ..Tiny::default()
    };
    let (dir, t) = tiny.load();
    assert!(dir.path().join("model.safetensors.index.json").is_file());
    check_target(&t, &[1, 0]).unwrap();
    // Tied: one storage for embed and lm_head, handed to a drafter without a copy.
    let w = t.shared_weights();
    let (e, l) = (w.embed.unwrap(), w.lm_head.unwrap());
    let (e, l) = (e.as_tensor().unwrap(), l.as_tensor().unwrap());
    let (se, _) = e.storage_and_layout();
    let (sl, _) = l.storage_and_layout();
    assert!(std::ptr::eq(&*se, &*sl));
}

#[test]
fn contract_bundled_target() {
    let t = bundled();
    assert_eq!(
        (t.vocab_size(), t.num_hidden_layers(), t.hidden_size()),
        (3000, 8, 192)
    );
    check_target(&t, &[1, 4, 7]).unwrap();
}

#[derive(serde::Deserialize)]
struct Fixture {
    prompts: Vec<Prompt>,
}

#[derive(serde::Deserialize)]
struct Prompt {
    tokens: Vec<u32>,
    last_logits_head: Vec<f32>,
    last_argmax: u32,
    last_logits: Option<Vec<f32>>,
    greedy: Vec<u32>,
}

#[test]
fn matches_hf_transformers() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3_tiny_hf.json");
    let fx: Fixture = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let t = bundled();
    let mut worst = 0f32;
    for (i, p) in fx.prompts.iter().enumerate() {
        let mut cache = t.new_cache(1).unwrap();
        let last = step(&t, &mut cache, &p.tokens, LogitRows::Last);
        let d = max_abs_diff(&last[..16], &p.last_logits_head);
        worst = worst.max(d);
        assert!(d <= 1e-4, "prompt {i}: first 16 logits differ by {d}");
        assert_eq!(argmax(&last), p.last_argmax, "prompt {i}");
        if let Some(row) = &p.last_logits {
            let d = max_abs_diff(&last, row);
            worst = worst.max(d);
            assert!(d <= 1e-4, "prompt {i}: the full logits row differs by {d}");
        }
        // Greedy target-only decoding, one cached step at a time.
        let mut tok = argmax(&last);
        let mut out = vec![tok];
        while out.len() < p.greedy.len() {
            tok = argmax(&step(&t, &mut cache, &[tok], LogitRows::Last));
            out.push(tok);
        }
        assert_eq!(out, p.greedy, "prompt {i}: greedy tokens");
    }
    eprintln!("max |logit diff| vs HF transformers: {worst:e}");
}

#[test]
fn long_prefill_equals_steps() {
    // 40 rows take the GEMM path, single steps the dot kernel.
    let t = bundled();
    let seq: Vec<u32> = (0..40u32).map(|i| (i * 37 + 11) % 3000).collect();
    let whole = step(&t, &mut t.new_cache(1).unwrap(), &seq, LogitRows::All);
    let mut cache = t.new_cache(1).unwrap();
    step(&t, &mut cache, &seq[..33], LogitRows::Last);
    for (j, &tok) in seq.iter().enumerate().skip(33) {
        let got = step(&t, &mut cache, &[tok], LogitRows::Last);
        let d = max_abs_diff(&got, &whole[j * 3000..(j + 1) * 3000]);
        assert!(d <= 1e-4, "position {j}: {d}");
    }
}

#[test]
fn bundled_drafter_loads_with_target_weights() {
    let t = bundled();
    let dir = bundled_dir().join("../drafter");
    let d = Qwen3Drafter::load(&dir, &t.target_spec(), t.shared_weights()).unwrap();
    assert_eq!(d.info().vocab.target, t.vocab_size());
    for &c in d.info().capture_layer_ids.as_slice() {
        assert!(c < t.num_hidden_layers());
    }
}

#[test]
fn config_errors_are_typed() {
    let tiny = Tiny::default();
    let cases: [(&str, Value); 5] = [
        ("vocab_size", json!(1u64 << 40)),
        ("hidden_size", Value::Null),
        ("hidden_act", json!("gelu")),
        ("num_key_value_heads", json!(3)),
        (
            "rope_parameters",
            json!({"rope_theta": 1e4, "rope_type": "yarn", "factor": 4.0}),
        ),
    ];
    for (key, value) in cases {
        let (_d, r) = tiny.try_load_with(
            |c| {
                if value.is_null() {
                    c.as_object_mut().unwrap().remove(key);
                } else {
                    c[key] = value.clone();
                }
            },
            |_| {},
        );
        let e = r.unwrap_err();
        assert_eq!(e.code(), "bad-config", "{key}: {e}");
        assert!(e.to_string().contains("config.json"), "{e}");
        let named = if key == "rope_parameters" {
            "rope_type"
        } else {
            key
        };
        assert!(e.to_string().contains(named), "{key}: {e}");
    }
}

#[test]
fn checkpoint_errors_are_typed() {
    let tiny = Tiny::default();
    let (_d, r) = tiny.try_load_with(
        |_| {},
        |t| {
            t.remove("model.layers.1.mlp.up_proj.weight");
        },
    );
    let e = r.unwrap_err();
    assert_eq!(e.code(), "missing-tensor", "{e}");
    assert!(
        e.to_string().contains("model.layers.1.mlp.up_proj.weight"),
        "{e}"
    );
    // Untied without an lm_head.
    let (_d, r) = tiny.try_load_with(
        |_| {},
        |t| {
            t.remove("lm_head.weight");
        },
    );
    let e = r.unwrap_err();
    assert_eq!(e.code(), "missing-tensor", "{e}");
    assert!(e.to_string().contains("tie_word_embeddings"), "{e}");
    // Wrong shapes: all reported, each typed.
    let (_d, r) = tiny.try_load_with(
        |_| {},
        |t| {
            t.insert(
                "model.layers.0.self_attn.q_norm.weight".into(),
                (vec![1.0; 4], vec![4]),
            );
            t.insert(
                "model.embed_tokens.weight".into(),
                (vec![0.0; 49 * 16], vec![49, 16]),
            );
        },
    );
    let e = r.unwrap_err();
    let codes: Vec<_> = e.problems().iter().map(|p| p.code()).collect();
    assert_eq!(codes, ["shape-mismatch", "shape-mismatch"], "{e}");
    assert!(
        e.to_string().contains("q_norm") && e.to_string().contains("embed_tokens"),
        "{e}"
    );
    // Biases promised by the config but absent.
    let (_d, r) = tiny.try_load_with(|c| c["attention_bias"] = json!(true), |_| {});
    assert_eq!(r.unwrap_err().problems()[0].code(), "missing-tensor");
    // No checkpoint at all.
    let dir = tempfile::tempdir().unwrap();
    tiny.write_with(dir.path(), |_| {}, |_| {});
    let e = Qwen3Target::load(&dir.path().join("nowhere"), &Device::Cpu).unwrap_err();
    assert_eq!(e.code(), "missing-file", "{e}");
}

#[test]
fn forward_errors_are_typed_and_leave_the_cache() {
    let (_dir, t) = Tiny::default().load();
    let mut cache = t.new_cache(2).unwrap();
    let ok = [1u32, 2, 3, 4];
    let run = |cache: &mut Qwen3Cache, tokens: &[u32], width, num: &[usize], cap: &[usize]| {
        let input = TargetInput {
            tokens,
            width,
            num_tokens: num,
            logits: LogitRows::All,
        };
        t.forward(cache, &input, cap).map(|_| ())
    };
    run(&mut cache, &ok, 2, &[2, 1], &[]).unwrap();
    let cases: [Case<'_>; 5] = [
        ("target-mismatch", &ok, 2, &[2, 2], &[3]),
        ("token-out-of-range", &[1, 50, 3, 4], 2, &[2, 2], &[]),
        ("invalid-argument", &ok, 2, &[3, 1], &[]),
        ("bad-shape", &ok, 2, &[2], &[]),
        ("bad-shape", &ok, 3, &[2, 1], &[]),
    ];
    for (code, tokens, width, num, cap) in cases {
        let e = run(&mut cache, tokens, width, num, cap).unwrap_err();
        assert_eq!(e.code(), code, "{e}");
        assert_eq!(cache.lengths(), [2, 1]);
    }
    // Padding is never validated.
    run(&mut cache, &[1, 50, 3, 4], 2, &[1, 2], &[]).unwrap();
    let e = t.truncate(&mut cache, &[3, 4]).unwrap_err();
    assert_eq!(e.code(), "invalid-argument", "{e}");
    t.truncate(&mut cache, &[0, 3]).unwrap();
    assert_eq!(t.cache_lengths(&cache), [0, 3]);
    // A cache of another model.
    let (_d2, other) = Tiny {
        layers: 2,
        ..Tiny::default()
    }
    .load();
    let mut wrong = other.new_cache(2).unwrap();
    assert_eq!(
        run(&mut wrong, &ok, 2, &[2, 2], &[]).unwrap_err().code(),
        "invalid-argument"
    );
}

#[test]
fn try_clone_does_not_share_buffers() {
    let (_dir, t) = Tiny::default().load();
    let mut a = t.new_cache(1).unwrap();
    step(&t, &mut a, &[1, 2, 3], LogitRows::Last);
    let mut b = a.try_clone().unwrap();
    t.truncate(&mut a, &[1]).unwrap();
    step(&t, &mut a, &[9, 9], LogitRows::Last); // overwrites a's rows 1..3
    let from_b = step(&t, &mut b, &[4], LogitRows::Last);
    let mut fresh = t.new_cache(1).unwrap();
    let want = step(&t, &mut fresh, &[1, 2, 3, 4], LogitRows::Last);
    assert!(max_abs_diff(&from_b, &want) < 1e-5);
}

#[test]
fn attention_over_transposed_keys_equals_the_row_layout() {
    use dspark::nn::{causal_gqa_attention, causal_gqa_attention_kt};
    let mut rng = Rng::new(9);
    let cpu = Device::Cpu;
    // hd 16 (values read in place) and hd 8 (values packed); 21 live tokens in a buffer of 32
    // whose dead tail holds NaN (rolled-back rows must not leak into the result).
    for hd in [16, 8] {
        let (s, cap, kvh, heads, q_len) = (21, 32, 2, 6, 4);
        let q =
            Tensor::from_vec(rng.vec(q_len * heads * hd, 1.0), (q_len, heads, hd), &cpu).unwrap();
        let k = Tensor::from_vec(rng.vec(s * kvh * hd, 1.0), (s, kvh, hd), &cpu).unwrap();
        let v = Tensor::from_vec(rng.vec(s * kvh * hd, 1.0), (s, kvh, hd), &cpu).unwrap();
        let nan_tail = |t: &Tensor, dim: usize| {
            let mut dims = t.dims().to_vec();
            dims[dim] = cap - s;
            let tail = Tensor::full(f32::NAN, dims, &cpu).unwrap();
            Tensor::cat(&[t, &tail], dim).unwrap()
        };
        let kt = nan_tail(&k.permute((1, 2, 0)).unwrap().contiguous().unwrap(), 2);
        let vb = nan_tail(&v, 0);
        let want = host(&causal_gqa_attention(&q, &k, &v, 0.3).unwrap());
        assert!(want.iter().all(|x| x.is_finite()));
        let fast = host(&causal_gqa_attention_kt(&q, &kt, &vb, s, 0.3).unwrap());
        assert_eq!(fast, want, "hd {hd}");
        // f64 takes the tensor path (keys transposed back): the same values.
        let f64s = |t: &Tensor| t.to_dtype(candle_core::DType::F64).unwrap();
        let slow = causal_gqa_attention_kt(&f64s(&q), &f64s(&kt), &f64s(&vb), s, 0.3).unwrap();
        let slow = host(&slow.to_dtype(candle_core::DType::F32).unwrap());
        assert!(max_abs_diff(&slow, &want) < 1e-5, "hd {hd}");
    }
}

#[test]
fn causal_attention_fast_path_equals_tensor_path() {
    use dspark::nn::causal_gqa_attention;
    let mut rng = Rng::new(5);
    let cpu = Device::Cpu;
    let q = Tensor::from_vec(rng.vec(5 * 4 * 8, 1.0), (5, 4, 8), &cpu).unwrap();
    let k = Tensor::from_vec(rng.vec(9 * 2 * 8, 1.0), (9, 2, 8), &cpu).unwrap();
    let v = Tensor::from_vec(rng.vec(9 * 2 * 8, 1.0), (9, 2, 8), &cpu).unwrap();
    let fast = host(&causal_gqa_attention(&q, &k, &v, 0.35).unwrap());
    // Non-contiguous views of the same values take the candle path.
    let strided = |x: &Tensor| {
        x.transpose(0, 1)
            .unwrap()
            .contiguous()
            .unwrap()
            .transpose(0, 1)
            .unwrap()
    };
    let (ks, vs) = (strided(&k), strided(&v));
    assert!(!ks.is_contiguous());
    let slow = host(&causal_gqa_attention(&q, &ks, &vs, 0.35).unwrap());
    assert!(
        max_abs_diff(&fast, &slow) < 1e-5,
        "{}",
        max_abs_diff(&fast, &slow)
    );
    // The last query sees everything: it equals non-causal attention over all keys.
    let full = dspark::nn::gqa_attention(
        &q.narrow(0, 4, 1).unwrap(),
        &k.transpose(0, 1).unwrap().contiguous().unwrap(),
        &v.transpose(0, 1).unwrap().contiguous().unwrap(),
        0.35,
    )
    .unwrap();
    assert!(max_abs_diff(&fast[4 * 32..], &host(&full)) < 1e-5);
}

/// CPU time of this process so far (user + system, all threads), in seconds (Linux).
fn process_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|x| x.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// Release timings of one forward on the bundled target (best wall time, and mean CPU time
/// of all threads, which a busy machine disturbs less):
/// `cargo test --release -p dspark --test targets_qwen3 timings -- --ignored --nocapture`.
#[test]
#[ignore]
fn timings() {
    let t = bundled();
    let ctx: Vec<u32> = (0..100u32).map(|i| (i * 37 + 11) % 3000).collect();
    let reps = 200;
    for (what, new) in [
        ("1 token at context 100", 1),
        ("9 tokens at context 100", 9),
        ("prefill 100 tokens", 100),
    ] {
        // `DSPARK_TIMINGS=prefill` (a substring) times one shape only, for a profiler.
        if !what.contains(&std::env::var("DSPARK_TIMINGS").unwrap_or_default()) {
            continue;
        }
        let mut cache = t.new_cache(1).unwrap();
        let held = if new == 100 { 0 } else { 100 };
        step(&t, &mut cache, &ctx[..held], LogitRows::Last);
        let input = TargetInput {
            tokens: &ctx[..new],
            width: new,
            num_tokens: &[new],
            logits: if new == 100 {
                LogitRows::Last
            } else {
                LogitRows::All
            },
        };
        let mut best = f64::INFINITY;
        let cpu = process_cpu_seconds();
        let start = Instant::now();
        for _ in 0..reps {
            let s = Instant::now();
            let out = t.forward(&mut cache, &input, &[1, 4, 7]).unwrap();
            std::hint::black_box(&out);
            best = best.min(s.elapsed().as_secs_f64());
            t.truncate(&mut cache, &[held]).unwrap();
        }
        let (wall, cpu) = (start.elapsed().as_secs_f64(), process_cpu_seconds() - cpu);
        eprintln!(
            "{what}: best {:.3} ms, mean {:.3} ms wall, {:.3} ms CPU",
            best * 1e3,
            wall / reps as f64 * 1e3,
            cpu / reps as f64 * 1e3
        );
    }
}

/// A target with one deliberate bug, to show the contract suite catches it.
struct Buggy {
    inner: Qwen3Target,
    bug: Bug,
}

#[derive(Clone, Copy, Debug)]
enum Bug {
    /// `truncate` succeeds without doing anything.
    IgnoreTruncate,
    /// Every forward starts from an empty cache.
    ForgetCache,
    /// Rows with no new token shift the batch (ragged batches misplace rows).
    DropEmptyRows,
    /// Out-of-range token ids are clamped instead of refused.
    NoValidation,
}

impl TargetModel for Buggy {
    type Cache = Qwen3Cache;
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn num_hidden_layers(&self) -> usize {
        self.inner.num_hidden_layers()
    }
    fn hidden_size(&self) -> usize {
        self.inner.hidden_size()
    }
    fn device(&self) -> Device {
        self.inner.device()
    }
    fn new_cache(&self, batch: usize) -> dspark::Result<Qwen3Cache> {
        self.inner.new_cache(batch)
    }
    fn forward(
        &self,
        cache: &mut Qwen3Cache,
        input: &TargetInput<'_>,
        capture: &[usize],
    ) -> dspark::Result<dspark::speculator::TargetOutput> {
        match self.bug {
            Bug::ForgetCache => {
                cache.truncate(&vec![0; cache.batch()])?;
                self.inner.forward(cache, input, capture)
            }
            Bug::DropEmptyRows if input.num_tokens.contains(&0) => {
                let mut n = input.num_tokens.to_vec();
                n.sort_unstable();
                n.reverse();
                self.inner.forward(
                    cache,
                    &TargetInput {
                        num_tokens: &n,
                        ..*input
                    },
                    capture,
                )
            }
            Bug::NoValidation
                if input
                    .tokens
                    .iter()
                    .any(|&t| t as usize >= self.vocab_size()) =>
            {
                let clamped: Vec<u32> = input
                    .tokens
                    .iter()
                    .map(|&t| t.min(self.vocab_size() as u32 - 1))
                    .collect();
                self.inner.forward(
                    cache,
                    &TargetInput {
                        tokens: &clamped,
                        ..*input
                    },
                    capture,
                )
            }
            _ => self.inner.forward(cache, input, capture),
        }
    }
    fn truncate(&self, cache: &mut Qwen3Cache, lengths: &[usize]) -> dspark::Result<()> {
        match self.bug {
            Bug::IgnoreTruncate => Ok(()),
            _ => self.inner.truncate(cache, lengths),
        }
    }
    fn cache_lengths(&self, cache: &Qwen3Cache) -> Vec<usize> {
        self.inner.cache_lengths(cache)
    }
}

#[test]
fn contract_catches_broken_targets() {
    for (bug, check) in [
        (Bug::IgnoreTruncate, "truncate-equals-fresh"),
        (Bug::ForgetCache, "steps-equal-whole"),
        (Bug::DropEmptyRows, "ragged-equals-alone"),
        (Bug::NoValidation, "refuses-bad-input"),
    ] {
        let (_dir, inner) = Tiny::default().load();
        let e = check_target(&Buggy { inner, bug }, &[0, 1]).unwrap_err();
        assert_eq!(e.code(), "invalid-argument", "{bug:?}: {e}");
        assert!(e.to_string().contains(check), "{bug:?}: {e}");
    }
}
