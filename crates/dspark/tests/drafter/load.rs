//! Loading: the contract values, shared target weights (used, checked, never silently random),
//! reduced and padded vocabularies, on-disk dtypes, and typed errors for misfits.
use crate::drafter_common::{H, Tiny, context, load, max_diff};
use candle_core::{Device, Tensor};
use dspark::nn::{LoadOptions, WeightDtype};
use dspark::sampling::Seeds;
use dspark::{Drafter, ProposeOptions, Qwen3Drafter, SharedWeights, WeightSource};

fn opts(t: f32) -> ProposeOptions {
    ProposeOptions {
        logit_bias: None,
        in_block: None,
        guides: None,
        temperature: t,
        seeds: Seeds::Scalar(3),
        top_k: None,
    }
}

#[test]
fn contract_values_and_shapes() {
    let tiny = Tiny::default();
    let (_dir, d) = load(&tiny);
    assert_eq!(d.info().block_size, 5);
    assert_eq!(d.info().num_draft_tokens, 5);
    assert_eq!(d.info().noise_token, 47);
    assert_eq!(d.info().vocab, dspark::VocabSizes::new(48, 48, 48));
    assert!(d.id_map().is_identity());
    assert_eq!(d.info().embed_source, WeightSource::Own);
    assert_eq!(d.info().lm_head_source, WeightSource::Own);
    assert_eq!(d.info().target_layer_ids.as_slice(), [0, 2]);
    assert_eq!(d.info().capture_layer_ids.as_slice(), [1, 3]);
    assert!(d.info().sample_from_anchor);
    assert!(d.info().has_confidence_head);
    assert_eq!(d.info().context_width, 2 * H);
    let p = d
        .propose(&context(1, 2, 6), &[1, 2], &[0], &opts(0.0))
        .unwrap();
    assert_eq!((p.batch, p.slots, p.target_vocab), (2, 5, 48));
    assert_eq!(p.tokens.len(), 10);
    assert_eq!(p.draft_logits.len(), 10 * 48);
    let c = p.confidence.as_ref().unwrap();
    assert!(c.iter().all(|x| (0.0..=1.0).contains(x)));
    // Greedy rows are one-hot at the drafted token.
    for (row, &tok) in p.draft_logits.chunks(48).zip(&p.tokens) {
        assert_eq!(row[tok as usize], 0.0);
        assert_eq!(row.iter().filter(|x| x.is_finite()).count(), 1);
    }
    let t = p.tokens_tensor(&Device::Cpu).unwrap();
    assert_eq!(t.dims(), [2, 5]);
    assert_eq!(
        p.draft_logits_tensor(&Device::Cpu).unwrap().dims(),
        [2, 5, 48]
    );
}

#[test]
fn deterministic_for_a_seed() {
    let (_dir, d) = load(&Tiny::default());
    let ctx = context(9, 3, 5);
    let a = d.propose(&ctx, &[1, 2, 3], &[0], &opts(1.0)).unwrap();
    let b = d.propose(&ctx, &[1, 2, 3], &[0], &opts(1.0)).unwrap();
    assert_eq!(a, b);
    // Another load of the same checkpoint gives the same block.
    let (_dir2, d2) = load(&Tiny::default());
    assert_eq!(a, d2.propose(&ctx, &[1, 2, 3], &[0], &opts(1.0)).unwrap());
    // Seeds drive sampling: some seed gives other tokens.
    let differs = (0..20).any(|s| {
        let o = ProposeOptions {
            logit_bias: None,
            in_block: None,
            guides: None,
            seeds: Seeds::Scalar(100 + s),
            ..opts(1.0)
        };
        d.propose(&ctx, &[1, 2, 3], &[0], &o).unwrap().tokens != a.tokens
    });
    assert!(differs);
}

#[test]
fn shared_weights_are_used_exactly() {
    // A drafter shipping embed + lm_head = X proposes exactly like one shipping neither and
    // given X from the target.
    let own = Tiny::default();
    let (_d1, with_own) = load(&own);
    let tensors = own.tensors();
    let as_tensor = |name: &str| {
        let (v, shape) = &tensors[name];
        Tensor::from_vec(v.clone(), shape.as_slice(), &Device::Cpu).unwrap()
    };
    let bare = Tiny {
        own_embed: false,
        own_lm_head: false,
        ..own.clone()
    };
    let dir = tempfile::tempdir().unwrap();
    // Same seed stream: write the bare checkpoint from the full tensor set minus the two.
    own.write_with(dir.path(), |t| {
        t.remove("embed_tokens.weight");
        t.remove("lm_head.weight");
    });
    let shared = SharedWeights {
        embed: Some(as_tensor("embed_tokens.weight").into()),
        lm_head: Some(as_tensor("lm_head.weight").into()),
        head: None,
    };
    let d = Qwen3Drafter::load(dir.path(), &bare.target(), shared).unwrap();
    assert_eq!(d.info().embed_source, WeightSource::SharedTarget);
    assert_eq!(d.info().lm_head_source, WeightSource::SharedTarget);
    let ctx = context(4, 2, 7);
    let a = with_own.propose(&ctx, &[5, 6], &[0], &opts(0.7)).unwrap();
    let b = d.propose(&ctx, &[5, 6], &[0], &opts(0.7)).unwrap();
    assert_eq!(a.tokens, b.tokens);
    assert!(max_diff(&a.draft_logits, &b.draft_logits) <= 1e-6);
    // Other target weights give other logits: the shared tensors are really read.
    let d3 = Qwen3Drafter::load(dir.path(), &bare.target(), bare.target_weights()).unwrap();
    let c = d3.propose(&ctx, &[5, 6], &[0], &opts(0.7)).unwrap();
    assert!(max_diff(&a.draft_logits, &c.draft_logits) > 1e-3);
}

#[test]
fn missing_or_misshapen_shared_weight_is_a_typed_error() {
    let bare = Tiny {
        own_embed: false,
        own_lm_head: false,
        ..Tiny::default()
    };
    let dir = tempfile::tempdir().unwrap();
    bare.write(dir.path());
    let target = bare.target();
    let full = bare.target_weights();
    let narrow = Tensor::zeros((48, H - 1), candle_core::DType::F32, &Device::Cpu).unwrap();
    let short = Tensor::zeros((40, H), candle_core::DType::F32, &Device::Cpu).unwrap();
    // What is refused, its code, and what the message names ("": nothing checked).
    let cases = [
        (SharedWeights::default(), "missing-tensor", "embed_tokens"),
        (
            SharedWeights {
                lm_head: None,
                ..full.clone()
            },
            "missing-tensor",
            "lm_head",
        ),
        (
            SharedWeights {
                embed: Some(narrow.into()),
                ..full.clone()
            },
            "shape-mismatch",
            "",
        ),
        (
            SharedWeights {
                lm_head: Some(short.into()),
                ..full
            },
            "shape-mismatch",
            "",
        ),
    ];
    for (shared, code, named) in cases {
        let e = Qwen3Drafter::load(dir.path(), &target, shared).unwrap_err();
        assert_eq!(e.code(), code);
        assert!(e.to_string().contains(named), "{e}");
    }
    // A target embedding with extra physical rows is fine (narrowed to V_in); bf16 too.
    let wide = Tensor::zeros((64, H), candle_core::DType::BF16, &Device::Cpu).unwrap();
    let ok = Qwen3Drafter::load(
        dir.path(),
        &target,
        SharedWeights {
            embed: Some(wide.into()),
            ..bare.target_weights()
        },
    );
    assert!(ok.is_ok(), "{:?}", ok.err());
}

#[test]
fn reduced_vocab_maps_through_d2t() {
    // 20 draft ids → target ids 2·d + 3 in a 48-id target vocabulary.
    let d2t: Vec<i64> = (0..20).map(|d| d + 3).collect();
    let tiny = Tiny {
        draft_vocab: Some(20),
        d2t: Some(d2t),
        ..Tiny::default()
    };
    let (_dir, d) = load(&tiny);
    assert!(!d.id_map().is_identity());
    assert_eq!(d.info().vocab.draft, 20);
    let image: Vec<u32> = (0..20).map(|x| 2 * x + 3).collect();
    for t in [0.0, 1.0] {
        let p = d
            .propose(&context(6, 4, 5), &[0, 10, 20, 47], &[0], &opts(t))
            .unwrap();
        assert_eq!(p.target_vocab, 48);
        assert!(p.tokens.iter().all(|x| image.contains(x)), "{:?}", p.tokens);
        for row in p.draft_logits.chunks(48) {
            for (id, v) in row.iter().enumerate() {
                if !image.contains(&(id as u32)) {
                    assert_eq!(*v, f32::NEG_INFINITY);
                }
            }
        }
    }
    // Without d2t a reduced drafter does not load.
    let dir = tempfile::tempdir().unwrap();
    Tiny {
        d2t: None,
        ..tiny.clone()
    }
    .write(dir.path());
    let e = Qwen3Drafter::load(dir.path(), &tiny.target(), tiny.target_weights()).unwrap_err();
    assert_eq!(e.code(), "missing-d2t");
}

#[test]
fn padded_rows_never_leave_the_drafter() {
    // V_d = 56 > V_t = 48; the padded lm_head rows are huge, so an unmasked argmax would
    // pick them every time.
    let tiny = Tiny {
        vocab: 56,
        draft_vocab: Some(56),
        target_vocab: 48,
        noise: 50,
        ..Tiny::default()
    };
    let dir = tempfile::tempdir().unwrap();
    tiny.write_with(dir.path(), |t| {
        let (v, _) = t.get_mut("lm_head.weight").unwrap();
        for x in &mut v[48 * H..] {
            *x = 50.0;
        }
    });
    let d = Qwen3Drafter::load(dir.path(), &tiny.target(), SharedWeights::default()).unwrap();
    for t in [0.0, 1.0] {
        let p = d
            .propose(&context(7, 3, 4), &[1, 2, 3], &[0], &opts(t))
            .unwrap();
        assert_eq!(p.target_vocab, 48);
        assert!(p.tokens.iter().all(|&x| x < 48), "{:?}", p.tokens);
    }
}

#[test]
fn bf16_and_f16_checkpoints_equal_f32_ones_of_their_values() {
    // A bf16 (f16) checkpoint equals an f32 checkpoint holding the rounded values, both kept
    // in the same dtype: widened to f32, or kept in the narrow one (a bf16 weight then
    // multiplies bf16-rounded activations, whichever file it came from).
    for (dtype, kept, round) in [
        (
            "bf16",
            WeightDtype::BF16,
            (|x: f32| half::bf16::from_f32(x).to_f32()) as fn(f32) -> f32,
        ),
        ("f16", WeightDtype::F16, |x: f32| {
            half::f16::from_f32(x).to_f32()
        }),
    ] {
        let low = Tiny {
            dtype,
            ..Tiny::default()
        };
        let d1 = tempfile::tempdir().unwrap();
        low.write(d1.path());
        let d2 = tempfile::tempdir().unwrap();
        Tiny::default().write_with(d2.path(), |t| {
            for (v, _) in t.values_mut() {
                v.iter_mut().for_each(|x| *x = round(*x));
            }
        });
        let ctx = context(8, 2, 5);
        for keep in [WeightDtype::F32, kept] {
            let options = LoadOptions {
                dtype: Some(keep),
                ..LoadOptions::default()
            };
            let load = |dir: &std::path::Path| {
                let (target, shared) = (low.target(), SharedWeights::default());
                Qwen3Drafter::builder(&target)
                    .shared(shared)
                    .options(options)
                    .load(dir)
                    .unwrap()
            };
            let (a, b) = (load(d1.path()), load(d2.path()));
            let pa = a.propose(&ctx, &[1, 2], &[0], &opts(0.5)).unwrap();
            let pb = b.propose(&ctx, &[1, 2], &[0], &opts(0.5)).unwrap();
            assert_eq!(pa, pb, "{dtype} kept as {keep}");
        }
    }
}

#[test]
fn misfit_targets_are_typed_errors() {
    let tiny = Tiny::default();
    let dir = tempfile::tempdir().unwrap();
    tiny.write(dir.path());
    // Target with too few layers for target_layer_ids [0, 2] (and num_target_layers 4).
    let few = dspark::TargetSpec::from_value(
        &serde_json::json!({"vocab_size": 48, "num_hidden_layers": 2, "hidden_size": H}),
        "t.json",
    )
    .unwrap();
    let e = Qwen3Drafter::load(dir.path(), &few, SharedWeights::default()).unwrap_err();
    assert!(
        e.problems().iter().all(|p| p.code() == "target-mismatch"),
        "{e}"
    );
    assert!(e.to_string().contains("target_layer_ids"), "{e}");
    let wide = dspark::TargetSpec::from_value(
        &serde_json::json!({"vocab_size": 48, "num_hidden_layers": 4, "hidden_size": 2 * H}),
        "t.json",
    )
    .unwrap();
    let e = Qwen3Drafter::load(dir.path(), &wide, SharedWeights::default()).unwrap_err();
    assert_eq!(e.code(), "target-mismatch");
    assert!(e.to_string().contains("hidden_size"), "{e}");
    // Unsupported Markov head type.
    let mut cfg = tiny.config();
    cfg["markov_head_type"] = serde_json::json!("gated");
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
    let e = Qwen3Drafter::load(dir.path(), &tiny.target(), SharedWeights::default()).unwrap_err();
    assert_eq!(e.code(), "bad-config");
    assert!(e.to_string().contains("markov_head_type"), "{e}");
}

#[test]
fn a_stale_or_broken_calibration_file_is_skipped_by_an_uncalibrated_load() {
    let tiny = Tiny {
        confidence: true,
        ..Tiny::default()
    };
    let dir = tempfile::tempdir().unwrap();
    tiny.write(dir.path());
    let target = tiny.target();
    let sts = dir.path().join(dspark::drafter::qwen3::STS_FILE);
    let target_config = dir.path().join("target.json");
    std::fs::write(&target_config, tiny.target_config().to_string()).unwrap();
    for stale in [r#"{"temperatures": [1.0]}"#, "{not json", ""] {
        std::fs::write(&sts, stale).unwrap();
        // A default load reads the file and refuses it as inspect does: the file's fault.
        let e = Qwen3Drafter::load(dir.path(), &target, SharedWeights::default()).unwrap_err();
        assert_eq!(e.code(), "bad-config", "{e}");
        assert!(e.to_string().contains("sts.json"), "{e}");
        assert!(!dspark::inspect(dir.path(), Some(&target_config)).ok());
        // A load that brings its own calibration (or none) never reads it.
        let d = Qwen3Drafter::builder(&target)
            .calibrated(false)
            .load(dir.path())
            .unwrap();
        assert!(d.sts().is_none() && d.info().has_confidence_head);
        let options = dspark::InspectOptions { calibration: false };
        let report = dspark::inspect_with(dir.path(), Some(&target_config), &options);
        assert!(report.ok(), "{}", report.to_json());
    }
}
