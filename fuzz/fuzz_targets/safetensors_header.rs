//! Arbitrary bytes through the safetensors header validator: it must never panic, and every
//! header it accepts must describe in-bounds, non-overlapping, correctly sized tensors.
#![no_main]

use std::path::Path;

use dspark::TensorInfo;
use dspark::checkpoint::header::{dtype_bits, parse_file_bytes, parse_header};
use libfuzzer_sys::fuzz_target;

fn check(tensors: &[TensorInfo], data_len: u64) {
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for t in tensors {
        let (begin, end) = t.data_offsets;
        assert!(begin <= end && end <= data_len, "{t:?} outside {data_len}");
        let bits = dtype_bits(&t.dtype).expect("accepted dtype is known");
        let numel = t.numel().expect("accepted shape does not overflow");
        assert_eq!(numel * bits, (end - begin) * 8, "{t:?}");
        if begin < end {
            ranges.push((begin, end));
        }
    }
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        assert!(w[0].1 <= w[1].0, "overlap {w:?}");
    }
    let mut names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), tensors.len(), "duplicate names accepted");
}

fuzz_target!(|data: &[u8]| {
    let path = Path::new("fuzz.safetensors");
    // The whole-file path (length prefix, header, data).
    if let Ok(tensors) = parse_file_bytes(data, path) {
        let n = u64::from_le_bytes(data[..8].try_into().unwrap_or([0; 8]));
        check(&tensors, data.len() as u64 - 8 - n);
    }
    // The header validator alone, with a data length taken from the first 8 bytes.
    if let Some((len, header)) = data.split_first_chunk::<8>() {
        let data_len = u64::from_le_bytes(*len);
        if let Ok(tensors) = parse_header(header, data_len, path) {
            check(&tensors, data_len);
        }
    }
});
