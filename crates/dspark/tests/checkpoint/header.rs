//! safetensors header parsing: valid files agree with the reference crate, and every
//! malformation is a typed `bad-safetensors` error naming the file.
use std::collections::HashMap;
use std::path::Path;

use crate::checkpoint_common::*;
use dspark::checkpoint::header::{MAX_HEADER_LEN, parse_file_bytes, parse_header, read_header};

/// The error of reading the file `write` makes (`bad.safetensors` in a scratch directory).
fn read_error(write: impl FnOnce(&Path)) -> dspark::Error {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.safetensors");
    write(&path);
    read_header(&path).unwrap_err()
}

fn bad_file(header: &[u8], data_len: u64) -> dspark::Error {
    let err = read_error(|path| write_raw(path, header, data_len));
    assert_eq!(err.code(), "bad-safetensors", "{err}");
    assert!(err.to_string().contains("bad.safetensors"), "{err}");
    err
}

fn parse(header: &str, data_len: u64) -> dspark::Result<Vec<dspark::TensorInfo>> {
    parse_header(header.as_bytes(), data_len, Path::new("x.safetensors"))
}

#[test]
fn agrees_with_reference_crate() {
    use safetensors::tensor::{Dtype, TensorView};
    let a = vec![1u8; 2 * 3 * 2];
    let b = vec![2u8; 5 * 8];
    let c = vec![3u8; 4];
    let views: HashMap<String, TensorView<'_>> = [
        ("a.weight", Dtype::BF16, vec![2, 3], &a),
        ("b", Dtype::I64, vec![5], &b),
        ("scalar", Dtype::F32, vec![], &c),
    ]
    .into_iter()
    .map(|(n, d, s, data)| (n.to_string(), TensorView::new(d, s, data).unwrap()))
    .collect();
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    let bytes = safetensors::serialize(&views, Some(meta)).unwrap();
    let ours = parse_file_bytes(&bytes, Path::new("ref.safetensors")).unwrap();
    let reference = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(ours.len(), 3);
    for t in &ours {
        let r = reference.tensor(&t.name).unwrap();
        assert_eq!(t.shape, r.shape());
        assert_eq!(t.dtype, format!("{:?}", r.dtype()));
        assert_eq!(t.byte_len() as usize, r.data().len());
    }
    // Same through the disk path.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ref.safetensors");
    std::fs::write(&path, &bytes).unwrap();
    let mut from_disk = read_header(&path).unwrap();
    let mut ours = ours;
    from_disk.sort_by(|x, y| x.name.cmp(&y.name));
    ours.sort_by(|x, y| x.name.cmp(&y.name));
    assert_eq!(
        from_disk
            .iter()
            .map(|t| (&t.name, &t.shape, t.data_offsets))
            .collect::<Vec<_>>(),
        ours.iter()
            .map(|t| (&t.name, &t.shape, t.data_offsets))
            .collect::<Vec<_>>()
    );
    assert!(from_disk.iter().all(|t| t.file == path));
}

#[test]
fn short_file() {
    let err = read_error(|path| std::fs::write(path, [1u8, 2, 3]).unwrap());
    assert_eq!(err.code(), "bad-safetensors");
    assert!(err.to_string().contains("shorter than the 8-byte"), "{err}");
}

#[test]
fn truncated_header() {
    let mut bytes = 1000u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    let err = read_error(|path| std::fs::write(path, &bytes).unwrap());
    assert_eq!(err.code(), "bad-safetensors");
    assert!(err.to_string().contains("truncated"), "{err}");
}

#[test]
fn oversized_header_length() {
    let mut bytes = (MAX_HEADER_LEN + 1).to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    let err = read_error(|path| std::fs::write(path, &bytes).unwrap());
    assert!(err.to_string().contains("oversized"), "{err}");
    let err = parse_file_bytes(&u64::MAX.to_le_bytes(), Path::new("m.safetensors")).unwrap_err();
    assert!(err.to_string().contains("oversized"), "{err}");
}

#[test]
fn offsets_past_the_end() {
    let err = bad_file(
        br#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#,
        12,
    );
    assert!(err.to_string().contains("past the end"), "{err}");
}

#[test]
fn non_utf8_header() {
    let err = bad_file(b"{\"a\xff\":{}}", 0);
    assert!(err.to_string().contains("UTF-8"), "{err}");
}

#[test]
fn bad_json_and_not_an_object() {
    let err = bad_file(b"{\"a\": ", 0);
    assert!(err.to_string().contains("not valid JSON"), "{err}");
    let err = bad_file(b"[1, 2]", 0);
    assert!(err.to_string().contains("not a JSON object"), "{err}");
}

#[test]
fn duplicate_names() {
    let t = r#"{"dtype":"F32","shape":[1],"data_offsets":[0,4]}"#;
    let u = r#"{"dtype":"F32","shape":[1],"data_offsets":[4,8]}"#;
    let header = format!(r#"{{"w":{t},"w":{u}}}"#);
    let err = bad_file(header.as_bytes(), 8);
    assert!(
        err.to_string().contains("duplicate tensor name `w`"),
        "{err}"
    );
}

#[test]
fn entry_level_errors() {
    let cases = [
        (
            r#"{"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}}"#,
            "unknown dtype",
        ),
        (
            r#"{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#,
            "non-negative",
        ),
        (
            r#"{"a":{"dtype":"F32","shape":"4","data_offsets":[0,4]}}"#,
            "non-negative",
        ),
        (
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}}"#,
            "begin <= end",
        ),
        (
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}}"#,
            "begin <= end",
        ),
        (
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#,
            "needs 8 bytes",
        ),
        (r#"{"a":{"shape":[2],"data_offsets":[0,8]}}"#, "dtype"),
        (r#"{"a":[1]}"#, "not an object"),
        (r#"{"__metadata__":{"k":1}}"#, "__metadata__.k"),
        (
            r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,4]}}"#,
            "overflows",
        ),
        (
            r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}"#,
            "overlapping",
        ),
        (
            r#"{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}}"#,
            "whole number of bytes",
        ),
    ];
    for (header, needle) in cases {
        let err = parse(header, 64).unwrap_err();
        assert_eq!(err.code(), "bad-safetensors", "{header}");
        assert!(err.to_string().contains(needle), "{header}: {err}");
        assert!(err.to_string().contains("x.safetensors"), "{err}");
    }
}

#[test]
fn accepts_metadata_empty_tensors_and_subbyte_dtypes() {
    let header = r#"{"__metadata__":{"format":"pt"},
        "e":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},
        "f4":{"dtype":"F4","shape":[4],"data_offsets":[0,2]},
        "s":{"dtype":"BF16","shape":[],"data_offsets":[2,4]}}   "#;
    let tensors = parse(header, 4).unwrap();
    let names: Vec<_> = tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["e", "f4", "s"]);
    assert_eq!(tensors[2].shape, Vec::<usize>::new());
    assert_eq!(tensors[2].numel(), Some(1));
}

#[test]
fn missing_file_is_typed() {
    let err = read_header(Path::new("/nonexistent/dir/x.safetensors")).unwrap_err();
    assert_eq!(err.code(), "missing-file");
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config {
        cases: 256,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x5eed),
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    })]
    /// Any file the reference crate writes parses to the same tensors; flipping one byte of
    /// its header never panics and, when it still parses, still describes valid tensors.
    #[test]
    fn roundtrip_and_mutation(
        shapes in proptest::collection::vec(proptest::collection::vec(0usize..5, 0..4), 1..6),
        flip in 0usize..4096,
        byte in proptest::prelude::any::<u8>(),
    ) {
        use safetensors::tensor::{Dtype, TensorView};
        let datas: Vec<Vec<u8>> = shapes.iter().map(|s| vec![7u8; s.iter().product::<usize>() * 4]).collect();
        let views: HashMap<String, TensorView<'_>> = shapes
            .iter()
            .zip(&datas)
            .enumerate()
            .map(|(i, (s, d))| (format!("t{i}"), TensorView::new(Dtype::F32, s.clone(), d).unwrap()))
            .collect();
        let bytes = safetensors::serialize(&views, None).unwrap();
        let ours = parse_file_bytes(&bytes, Path::new("p.safetensors")).unwrap();
        proptest::prop_assert_eq!(ours.len(), shapes.len());
        for t in &ours {
            let i: usize = t.name[1..].parse().unwrap();
            proptest::prop_assert_eq!(&t.shape, &shapes[i]);
        }
        let mut mutated = bytes.clone();
        let at = 8 + flip % (bytes.len() - 8).max(1);
        if at < mutated.len() {
            mutated[at] = byte;
        }
        if let Ok(tensors) = parse_file_bytes(&mutated, Path::new("p.safetensors")) {
            for t in tensors {
                proptest::prop_assert_eq!(t.numel().map(|n| n * 4), Some(t.byte_len()));
            }
        }
    }
}
