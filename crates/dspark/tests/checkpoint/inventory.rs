//! Checkpoint inventories: single files, directories, shard indexes, and the one data read.
use std::path::Path;

use crate::checkpoint_common::*;
use dspark::Inventory;

fn index(dir: &Path, entries: &[(&str, &str)]) {
    let map: serde_json::Map<String, serde_json::Value> = entries
        .iter()
        .map(|(n, s)| (n.to_string(), serde_json::Value::from(*s)))
        .collect();
    let json = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), json.to_string()).unwrap();
}

#[test]
fn single_file_and_directory() {
    let tensors = [bf16("a", &[2, 2]), bf16("b", &[3])];
    let (_g, dir) = checkpoint_dir(&tensors);
    for path in [dir.clone(), dir.join("model.safetensors")] {
        let inv = Inventory::open(&path).unwrap();
        assert_eq!(inv.len(), 2);
        assert_eq!(inv.get("a").unwrap().shape, [2, 2]);
        assert_eq!(inv.get("b").unwrap().data_offsets, (8, 14));
        assert_eq!(inv.files, [dir.join("model.safetensors")]);
    }
}

#[test]
fn loose_files_sorted_and_disjoint() {
    let dir = tempfile::tempdir().unwrap();
    write_st(&dir.path().join("b.safetensors"), &[bf16("y", &[1])]);
    write_st(&dir.path().join("a.safetensors"), &[bf16("x", &[1])]);
    std::fs::write(dir.path().join("notes.txt"), "hi").unwrap();
    let inv = Inventory::open(dir.path()).unwrap();
    assert_eq!(
        inv.files,
        [
            dir.path().join("a.safetensors"),
            dir.path().join("b.safetensors")
        ]
    );
    assert_eq!(
        inv.tensors().map(|t| t.name.as_str()).collect::<Vec<_>>(),
        ["x", "y"]
    );
    // The same name in two files is an error.
    write_st(&dir.path().join("c.safetensors"), &[bf16("x", &[1])]);
    let err = Inventory::open(dir.path()).unwrap_err();
    assert_eq!(err.code(), "bad-safetensors");
    assert!(err.to_string().contains("`x` is also in"), "{err}");
}

#[test]
fn empty_or_absent_is_missing_file() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        Inventory::open(dir.path()).unwrap_err().code(),
        "missing-file"
    );
    assert_eq!(
        Inventory::open(&dir.path().join("nope"))
            .unwrap_err()
            .code(),
        "missing-file"
    );
}

#[test]
fn sharded_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_st(
        &d.join("model-00001-of-00002.safetensors"),
        &[bf16("a", &[2]), bf16("b", &[2])],
    );
    write_st(
        &d.join("model-00002-of-00002.safetensors"),
        &[bf16("c", &[4])],
    );
    // A stray file next to the shards is not read.
    write_st(&d.join("model.safetensors"), &[bf16("stray", &[1])]);
    index(
        d,
        &[
            ("a", "model-00001-of-00002.safetensors"),
            ("b", "model-00001-of-00002.safetensors"),
            ("c", "model-00002-of-00002.safetensors"),
        ],
    );
    let inv = Inventory::open(d).unwrap();
    assert_eq!(inv.len(), 3);
    assert_eq!(inv.files.len(), 2);
    assert!(inv.get("stray").is_none());
    assert_eq!(
        inv.get("c").unwrap().file,
        d.join("model-00002-of-00002.safetensors")
    );
    // Opening the index file directly works too.
    let inv2 = Inventory::open(&d.join("model.safetensors.index.json")).unwrap();
    assert_eq!(inv2.len(), 3);
}

#[test]
fn missing_shards_are_all_reported() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_st(&d.join("s1.safetensors"), &[bf16("a", &[2])]);
    index(
        d,
        &[
            ("a", "s1.safetensors"),
            ("b", "s2.safetensors"),
            ("c", "s3.safetensors"),
        ],
    );
    let err = Inventory::open(d).unwrap_err();
    assert_eq!(codes(&err), ["missing-file", "missing-file"]);
    assert!(
        err.to_string().contains("s2.safetensors") && err.to_string().contains("s3.safetensors")
    );
}

#[test]
fn name_in_the_wrong_shard() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_st(&d.join("s1.safetensors"), &[bf16("a", &[2])]);
    write_st(&d.join("s2.safetensors"), &[bf16("b", &[2])]);
    // Only s2 is named: it does not hold `a`.
    index(d, &[("a", "s2.safetensors"), ("b", "s2.safetensors")]);
    let err = Inventory::open(d).unwrap_err();
    assert_eq!(err.code(), "bad-safetensors");
    assert!(
        err.to_string()
            .contains("`a` is mapped to shard `s2.safetensors`, which does not hold it"),
        "{err}"
    );
    // Both shards named, mappings swapped: each name is found elsewhere.
    index(d, &[("a", "s2.safetensors"), ("b", "s1.safetensors")]);
    let err = Inventory::open(d).unwrap_err();
    assert_eq!(codes(&err), ["bad-safetensors", "bad-safetensors"]);
    assert!(
        err.to_string()
            .contains("`a` is mapped to shard `s2.safetensors` but stored in"),
        "{err}"
    );
}

#[test]
fn name_in_index_but_not_in_any_shard_and_tensor_in_two_shards() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_st(&d.join("s1.safetensors"), &[bf16("a", &[2])]);
    index(d, &[("a", "s1.safetensors"), ("ghost", "s1.safetensors")]);
    let err = Inventory::open(d).unwrap_err();
    assert_eq!(err.code(), "bad-safetensors");
    assert!(err.to_string().contains("`ghost`"), "{err}");

    write_st(&d.join("s2.safetensors"), &[bf16("a", &[2])]);
    index(d, &[("a", "s1.safetensors"), ("b", "s2.safetensors")]);
    let err = Inventory::open(d).unwrap_err();
    assert!(err.problems().iter().all(|e| e.code() == "bad-safetensors"));
    assert!(err.to_string().contains("`a` is also in"), "{err}");
}

#[test]
fn bad_index_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (body, needle) in [
        ("{not json", "not valid JSON"),
        (r#"{"metadata": {}}"#, "weight_map"),
        (r#"{"weight_map": {"a": 3}}"#, "weight_map.a"),
        (
            r#"{"weight_map": {"a": "../escape.safetensors"}}"#,
            "weight_map.a",
        ),
    ] {
        std::fs::write(d.join("model.safetensors.index.json"), body).unwrap();
        let err = Inventory::open(d).unwrap_err();
        assert_eq!(err.code(), "bad-safetensors", "{body}");
        assert!(err.to_string().contains(needle), "{body}: {err}");
    }
}

#[test]
fn read_i64_reads_only_that_tensor() {
    let values = [0i64, -1, 5, i64::MAX, i64::MIN];
    let i32s: Vec<u8> = [7i32, -8, 9].iter().flat_map(|v| v.to_le_bytes()).collect();
    let tensors = [
        bf16("w", &[3, 3]),
        i64s("d2t", &values),
        T {
            name: "small".into(),
            dtype: "I32",
            shape: vec![3],
            data: Some(i32s),
        },
    ];
    let (_g, dir) = checkpoint_dir(&tensors);
    let inv = Inventory::open(&dir).unwrap();
    assert_eq!(inv.read_i64("d2t").unwrap(), values);
    assert_eq!(inv.read_i64("small").unwrap(), [7, -8, 9]);
    let err = inv.read_i64("w").unwrap_err();
    assert_eq!(err.code(), "bad-dtype");
    assert!(err.to_string().contains("`w`") && err.to_string().contains("BF16"));
    assert_eq!(inv.read_i64("nope").unwrap_err().code(), "missing-tensor");
}

#[test]
fn read_i64_detects_a_file_changed_underneath() {
    let (_g, dir) = checkpoint_dir(&[bf16("w", &[64]), i64s("d2t", &[1, 2, 3])]);
    let inv = Inventory::open(&dir).unwrap();
    // Truncate the data section after the header was read.
    let file = dir.join("model.safetensors");
    let len = std::fs::metadata(&file).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(len - 8)
        .unwrap();
    assert_eq!(inv.read_i64("d2t").unwrap_err().code(), "bad-safetensors");
}

#[test]
fn sparse_multi_gigabyte_file_reads_headers_only() {
    // 8 GiB logical size, no disk used: the inventory only reads the header.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let big = [
        bf16("embed_tokens.weight", &[151_936, 4096]),
        bf16("lm_head.weight", &[151_936, 4096]),
        i64s("d2t", &[0, 0]),
    ];
    let (header, data_len) = header_json(&big);
    write_raw(&path, header.as_bytes(), data_len.max(8 << 30));
    let inv = Inventory::open(dir.path()).unwrap();
    assert_eq!(inv.get("lm_head.weight").unwrap().shape, [151_936, 4096]);
    assert_eq!(inv.read_i64("d2t").unwrap(), [0, 0]);
}
