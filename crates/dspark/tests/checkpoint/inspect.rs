//! The config and `inspect` side of the adversarial suite: config-derived sizes are bounded
//! (`bad-config` naming the key), headers are checked before any data is read, and config
//! files must be regular files of bounded size — so `inspect` returns quickly with typed
//! errors whatever a directory holds or its headers claim.
//!
//! Deterministic: a fixed ChaCha seed and a bounded case count.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::checkpoint_common::{T, bf16, i64s, write_raw, write_st};
use dspark::checkpoint::Inventory;
use dspark::limits::{MAX_CONFIG_BYTES, MAX_INDEX_BYTES, MAX_LAYERS, MAX_VOCAB};
use dspark::sampling::StsCalibration;
use dspark::{DraftSpec, TargetSpec, inspect};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{Value, json};

/// A small valid reduced-vocabulary DeepSpec drafter (`V_d = 16 < V_t = 32`).
fn draft_config() -> Value {
    json!({
        "architectures": ["Qwen3DSparkModel"],
        "model_type": "qwen3",
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
        "intermediate_size": 16
    })
}

fn target_config() -> Value {
    json!({"vocab_size": 32, "num_hidden_layers": 4, "hidden_size": 8})
}

fn write_json(dir: &Path, name: &str, v: &Value) {
    std::fs::write(dir.join(name), serde_json::to_vec(v).unwrap()).unwrap();
}

/// A scratch directory holding `config.json` written from `v`.
fn config_dir(v: &Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_json(dir.path(), "config.json", v);
    dir
}

/// `inspect` of the drafter at `draft` against the target at `target`, run on another thread
/// and failing past `limit`: its report and how long it took.
fn timed_inspect(draft: &Path, target: &Path, limit: Duration) -> (dspark::Report, Duration) {
    let (d, t) = (draft.to_path_buf(), target.to_path_buf());
    let start = Instant::now();
    let report = within(limit, move || inspect(&d, Some(&t)));
    (report, start.elapsed())
}

/// Run `f` on another thread; fail (instead of hanging) if it takes longer than `limit`.
fn within<R: Send + 'static>(limit: Duration, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("did not return within {limit:?}"))
}

fn codes(r: &dspark::Report) -> Vec<&'static str> {
    r.errors
        .iter()
        .flat_map(|e| e.problems())
        .map(|e| e.code())
        .collect()
}

/// The report's error messages, joined.
fn messages(r: &dspark::Report) -> String {
    r.errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" | ")
}

#[test]
fn absurd_config_sizes_are_bad_config_naming_the_key() {
    for (key, value) in [
        ("num_hidden_layers", json!(10_000_000u64)),
        ("vocab_size", json!(1u64 << 40)),
        ("draft_vocab_size", json!(MAX_VOCAB + 1)),
        ("hidden_size", json!(u64::MAX)),
        ("intermediate_size", json!(1u64 << 40)),
        ("num_attention_heads", json!(1u64 << 40)),
        ("head_dim", json!(1u64 << 40)),
        ("block_size", json!(1u64 << 40)),
        ("markov_rank", json!(1u64 << 40)),
        ("num_target_layers", json!(MAX_LAYERS + 1)),
        ("target_layer_ids", json!([0, 1_000_000_000_000i64])),
    ] {
        let mut v = draft_config();
        v[key] = value;
        let e = DraftSpec::from_value(&v, "d/config.json").unwrap_err();
        assert_eq!(e.code(), "bad-config", "{key}: {e}");
        assert!(e.to_string().contains(key), "{key}: {e}");
        assert!(e.to_string().contains("d/config.json"), "{key}: {e}");
    }
    for key in ["vocab_size", "num_hidden_layers", "hidden_size"] {
        let mut v = target_config();
        v[key] = json!(1u64 << 40);
        let e = TargetSpec::from_value(&v, "t/config.json").unwrap_err();
        assert_eq!(e.code(), "bad-config", "{key}: {e}");
        assert!(e.to_string().contains(key), "{key}: {e}");
    }
    // At the limits, configs still parse.
    let mut v = draft_config();
    v["num_hidden_layers"] = json!(MAX_LAYERS);
    assert_eq!(
        DraftSpec::from_value(&v, "d")
            .unwrap()
            .shape
            .num_hidden_layers,
        MAX_LAYERS as usize
    );
}

#[test]
fn inspect_on_a_config_claiming_ten_million_layers_returns_quickly() {
    let mut v = draft_config();
    v["num_hidden_layers"] = json!(10_000_000u64);
    let dir = config_dir(&v);
    // A checkpoint, so that nothing short-circuits before the plan would be built.
    write_st(
        &dir.path().join("model.safetensors"),
        &[bf16("fc.weight", &[8, 16])],
    );
    let mut tv = target_config();
    tv["num_hidden_layers"] = json!(10_000_000u64);
    let t = config_dir(&tv);
    let (report, took) = timed_inspect(dir.path(), t.path(), Duration::from_secs(20));
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(!report.ok());
    assert_eq!(
        codes(&report),
        ["bad-config", "bad-config"],
        "{}",
        messages(&report)
    );
    assert!(messages(&report).contains("num_hidden_layers"));
}

#[test]
fn a_sparse_d2t_claiming_a_billion_entries_is_refused_from_its_header() {
    let dir = config_dir(&draft_config());
    let t = config_dir(&target_config());
    // Header: d2t is I64 [10^9] = 8 GB of data, present (sparse) in the file.
    let n: u64 = 1_000_000_000;
    let header = format!(
        "{{\"d2t\":{{\"dtype\":\"I64\",\"shape\":[{n}],\"data_offsets\":[0,{}]}}}}",
        n * 8
    );
    let st = dir.path().join("model.safetensors");
    write_raw(&st, header.as_bytes(), n * 8);
    let (report, took) = timed_inspect(dir.path(), t.path(), Duration::from_secs(20));
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(
        codes(&report).contains(&"d2t-wrong-length"),
        "{}",
        messages(&report)
    );
    // The one data read refuses it from the header as well.
    let inv = Inventory::open(dir.path()).unwrap();
    assert_eq!(inv.read_i64("d2t").unwrap_err().code(), "too-large");
}

#[test]
fn a_d2t_whose_data_lies_past_the_file_is_refused_before_reading() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("model.safetensors");
    write_st(&p, &[i64s("d2t", &[0, 1, 2])]);
    let inv = Inventory::open(dir.path()).unwrap();
    assert_eq!(inv.read_i64("d2t").unwrap(), [0, 1, 2]);
    // Truncate the file after its header was read: the data range is checked against the
    // real file length before anything is allocated or read.
    let len = std::fs::metadata(&p).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(len - 8)
        .unwrap();
    let e = inv.read_i64("d2t").unwrap_err();
    assert_eq!(e.code(), "bad-safetensors", "{e}");
}

#[cfg(unix)]
#[test]
fn fifo_and_device_configs_are_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("config.json");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if made.is_ok_and(|s| s.success()) {
        let d = dir.path().to_path_buf();
        let report = within(Duration::from_secs(10), move || inspect(&d, None));
        let c = codes(&report);
        assert!(
            !c.is_empty() && c.iter().all(|&c| c == "bad-config"),
            "{}",
            messages(&report)
        );
        assert!(messages(&report).contains("FIFO"), "{}", messages(&report));
        let f = fifo.clone();
        let e = within(Duration::from_secs(10), move || {
            StsCalibration::from_json_path(&f).unwrap_err()
        });
        assert_eq!(e.code(), "bad-config");
        let f = fifo.clone();
        let e = within(Duration::from_secs(10), move || {
            TargetSpec::from_path(&f).unwrap_err()
        });
        assert_eq!(e.code(), "bad-config");
    }
    let zero = Path::new("/dev/zero");
    if zero.exists() {
        let e = within(Duration::from_secs(10), move || {
            DraftSpec::from_path(zero).unwrap_err()
        });
        assert_eq!(e.code(), "bad-config");
        assert!(e.to_string().contains("/dev/zero"), "{e}");
        let e = StsCalibration::from_json_path(zero).unwrap_err();
        assert_eq!(e.code(), "bad-config");
    }
}

#[test]
fn oversized_config_and_index_files_are_refused_by_size() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.json");
    // Sparse: the size check comes from metadata, nothing is read.
    let f = std::fs::File::create(&cfg).unwrap();
    f.set_len(MAX_CONFIG_BYTES + 1).unwrap();
    let e = DraftSpec::from_path(dir.path()).unwrap_err();
    assert_eq!(e.code(), "bad-config");
    assert!(e.to_string().contains("limit"), "{e}");
    let index = dir.path().join("model.safetensors.index.json");
    let f = std::fs::File::create(&index).unwrap();
    f.set_len(MAX_INDEX_BYTES + 1).unwrap();
    let e = Inventory::open(dir.path()).unwrap_err();
    assert_eq!(e.code(), "bad-safetensors");
    assert!(e.to_string().contains("limit"), "{e}");
    // A directory where a config file should be (a directory's `config.json` is read).
    let nested = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(nested.path().join("config.json/config.json")).unwrap();
    let e = TargetSpec::from_path(&nested.path().join("config.json")).unwrap_err();
    assert_eq!(e.code(), "bad-config");
}

#[test]
fn headers_with_too_many_tensors_or_name_bytes_are_too_large() {
    use dspark::checkpoint::header::parse_header;
    use dspark::limits::{MAX_NAME_BYTES, MAX_TENSORS};
    let entry =
        |i: u64| format!("\"t{i}\":{{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}");
    let many: Vec<String> = (0..=MAX_TENSORS).map(entry).collect();
    let header = format!("{{{}}}", many.join(","));
    let e = parse_header(header.as_bytes(), 0, Path::new("m.safetensors")).unwrap_err();
    assert_eq!(e.code(), "too-large", "{e}");
    assert!(e.to_string().contains("m.safetensors"), "{e}");
    let long = "n".repeat(MAX_NAME_BYTES as usize + 1);
    let header =
        format!("{{\"{long}\":{{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}}}");
    let e = parse_header(header.as_bytes(), 0, Path::new("m.safetensors")).unwrap_err();
    assert_eq!(e.code(), "too-large", "{e}");
    // Across shards: two files of MAX_TENSORS / 2 + 1 tensors each.
    let dir = tempfile::tempdir().unwrap();
    let half = MAX_TENSORS / 2 + 1;
    for (f, offset) in [("a.safetensors", 0), ("b.safetensors", half)] {
        let names: Vec<String> = (offset..offset + half).map(entry).collect();
        let h = format!("{{{}}}", names.join(","));
        write_raw(&dir.path().join(f), h.as_bytes(), 0);
    }
    let e = Inventory::open(dir.path()).unwrap_err();
    assert_eq!(e.code(), "too-large", "{e}");
}

#[test]
fn many_unexpected_tensors_give_a_bounded_number_of_warnings() {
    use crate::checkpoint_common::{qwen3_spec, qwen3_tensors, target};
    let spec = qwen3_spec(100, 100);
    let mut tensors = qwen3_tensors(&spec);
    tensors.extend((0..200).map(|i| bf16(&format!("extra.{i}.weight"), &[1])));
    let (_guard, dir) = crate::checkpoint_common::checkpoint_dir(&tensors);
    let inventory = Inventory::open(&dir).unwrap();
    let plan = dspark::LoadPlan::build(&spec, &target(100), &inventory).unwrap();
    assert_eq!(plan.ignored.len(), 200);
    assert_eq!(plan.warnings.len(), 65, "{:?}", plan.warnings.last());
    assert!(
        plan.warnings[64].message.contains("136 more"),
        "{:?}",
        plan.warnings[64]
    );
}

/// A config value: ordinary, at or past a limit, huge, or of the wrong type.
fn size_value() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        4 => Just(None),
        2 => (1u64..40).prop_map(|n| Some(json!(n))),
        1 => Just(Some(json!(MAX_LAYERS))),
        1 => Just(Some(json!(MAX_LAYERS + 1))),
        1 => Just(Some(json!(MAX_VOCAB + 1))),
        1 => Just(Some(json!(10_000_000u64))),
        1 => Just(Some(json!(1u64 << 40))),
        1 => Just(Some(json!(u64::MAX))),
        1 => Just(Some(json!(-1))),
        1 => Just(Some(json!(0))),
        1 => Just(Some(json!(true))),
        1 => Just(Some(json!(1.5))),
        1 => Just(Some(json!("8"))),
    ]
}

const KEYS: [&str; 12] = [
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
];

/// A tensor of the checkpoint: an ordinary one or one whose header claims a huge shape.
fn tensor() -> impl Strategy<Value = T> {
    let name = prop_oneof![
        Just("d2t"),
        Just("lm_head.weight"),
        Just("fc.weight"),
        Just("markov_head.markov_w1.weight"),
        Just("layers.0.self_attn.q_proj.weight"),
        Just("confidence_head.proj.weight"),
    ];
    let dim = prop_oneof![4 => 0usize..40, 1 => Just(1usize << 20), 1 => Just(1_000_000_000)];
    (name, proptest::collection::vec(dim, 0..3)).prop_map(|(name, shape)| {
        if name == "d2t" {
            T {
                name: name.into(),
                dtype: "I64",
                shape,
                data: None,
            }
        } else {
            bf16(name, &shape)
        }
    })
}

/// A header for `tensors` laid out back to back (saturating: absurd shapes give absurd but
/// well-formed offsets); returns it and the data length.
fn header_of(tensors: &[T]) -> (String, u64) {
    let mut offset = 0u64;
    let mut entries = Vec::new();
    for t in tensors {
        let bytes = if t.dtype == "I64" { 8 } else { 2 };
        let len = t
            .shape
            .iter()
            .fold(bytes, |a: u64, &d| a.saturating_mul(d as u64));
        let end = offset.saturating_add(len);
        entries.push(format!(
            "\"{}\":{{\"dtype\":\"{}\",\"shape\":{:?},\"data_offsets\":[{offset},{end}]}}",
            t.name, t.dtype, t.shape
        ));
        offset = end;
    }
    (format!("{{{}}}", entries.join(",")), offset)
}

#[test]
fn inspect_returns_quickly_with_typed_errors_on_random_drafters() {
    let config = Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &[9; 32]));
    let case = (
        proptest::collection::vec(size_value(), KEYS.len()),
        size_value(),
        proptest::collection::vec(tensor(), 0..5),
    );
    runner
        .run(&case, |(values, target_layers, tensors)| {
            let mut v = draft_config();
            for (key, value) in KEYS.iter().zip(values) {
                if let Some(value) = value {
                    v[*key] = value;
                }
            }
            let mut t = target_config();
            if let Some(n) = target_layers {
                t["num_hidden_layers"] = n;
            }
            match DraftSpec::from_value(&v, "d") {
                Ok(s) => {
                    prop_assert!(s.shape.vocab_size as u64 <= MAX_VOCAB);
                    prop_assert!(s.draft_vocab_size as u64 <= MAX_VOCAB);
                    prop_assert!(s.shape.num_hidden_layers as u64 <= MAX_LAYERS);
                }
                Err(e) => {
                    let allowed = ["bad-config", "noise-token-out-of-range"];
                    prop_assert!(allowed.contains(&e.code()), "{e}");
                }
            }
            let dir = config_dir(&v);
            let tdir = config_dir(&t);
            let mut seen = std::collections::HashSet::new();
            let tensors: Vec<T> = tensors
                .into_iter()
                .filter(|x| seen.insert(x.name.clone()))
                .collect();
            // Huge claimed shapes overflow a real layout: write the header with sparse data.
            let st = dir.path().join("model.safetensors");
            let (header, data_len) = header_of(&tensors);
            write_raw(&st, header.as_bytes(), data_len.min(1 << 36));
            let (report, took) = timed_inspect(dir.path(), tdir.path(), Duration::from_secs(30));
            prop_assert!(took < Duration::from_secs(10), "{took:?}");
            let known = [
                "bad-config",
                "noise-token-out-of-range",
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
            for c in codes(&report) {
                prop_assert!(
                    known.contains(&c),
                    "untyped problem {c}: {}",
                    messages(&report)
                );
            }
            prop_assert_eq!(report.ok(), report.errors.is_empty());
            Ok(())
        })
        .unwrap();
}
