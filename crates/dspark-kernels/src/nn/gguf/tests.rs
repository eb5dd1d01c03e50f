use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};

use super::*;
use crate::test_values::values;

/// A GGUF file `name` in `dir` with `tensors` (name, row-major values, shape, type) and
/// `general.architecture = qwen3`, written by candle's writer; its path.
fn write(dir: &Path, name: &str, tensors: &[(&str, Vec<f32>, Vec<usize>, GgmlDType)]) -> PathBuf {
    let path = dir.join(name);
    let q: Vec<(String, QTensor)> = tensors
        .iter()
        .map(|(name, v, shape, t)| {
            let x = Tensor::from_vec(v.clone(), shape.as_slice(), &Device::Cpu).unwrap();
            let qt = match t {
                GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => {
                    let dt = match t {
                        GgmlDType::F32 => DType::F32,
                        GgmlDType::F16 => DType::F16,
                        _ => DType::BF16,
                    };
                    let x = x.to_dtype(dt).unwrap();
                    QTensor::quantize(&x, *t).unwrap()
                }
                _ => QTensor::quantize(&x, *t).unwrap(),
            };
            (name.to_string(), qt)
        })
        .collect();
    let arch = Value::String("qwen3".into());
    let count = Value::U32(2);
    let metadata = [("general.architecture", &arch), ("test.count", &count)];
    let refs: Vec<(&str, &QTensor)> = q.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut file = std::fs::File::create(&path).unwrap();
    gguf_file::write(&mut file, &metadata, &refs).unwrap();
    path
}

fn sample(dir: &Path) -> PathBuf {
    write(
        dir,
        "m.gguf",
        &[
            ("norm", values(64, 1), vec![64], GgmlDType::F32),
            ("emb", values(8 * 64, 2), vec![8, 64], GgmlDType::BF16),
            ("q8", values(5 * 64, 3), vec![5, 64], GgmlDType::Q8_0),
            ("q4", values(9 * 512, 4), vec![9, 512], GgmlDType::Q4K),
            ("q6", values(3 * 256, 5), vec![3, 256], GgmlDType::Q6K),
        ],
    )
}

#[test]
fn tensors_are_read_in_their_types_and_quantized_ones_regrouped() {
    let dir = tempfile::tempdir().unwrap();
    let path = sample(dir.path());
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.string("general.architecture").unwrap(), Some("qwen3"));
    assert_eq!(f.uint("test.count").unwrap(), Some(2));
    assert_eq!(f.float("test.count").unwrap(), Some(2.0));
    assert_eq!(f.string("test.count").unwrap_err().code(), "bad-gguf");
    assert_eq!(f.shape("q4"), Some(&[9usize, 512][..]));
    assert_eq!(f.type_of("q6"), Some("Q6_K"));
    assert_eq!(f.quant("q8"), Some(Quant::Q8_0));
    assert_eq!(f.quant("emb"), None);
    let keep = LoadOptions::default();
    let GgufTensor::Float(norm) = f.read("norm", &Device::Cpu, &keep).unwrap() else {
        panic!("norm is a float tensor");
    };
    assert_eq!(norm.to_vec1::<f32>().unwrap(), values(64, 1));
    let GgufTensor::Float(emb) = f.read("emb", &Device::Cpu, &keep).unwrap() else {
        panic!("emb is a float tensor");
    };
    assert_eq!(emb.dtype(), DType::BF16);
    // Each quantized matrix holds what candle's reading of the same bytes holds.
    let mut reader = std::io::BufReader::new(std::fs::File::open(&path).unwrap());
    let content = gguf_file::Content::read(&mut reader).unwrap();
    for (name, quant) in [("q8", Quant::Q8_0), ("q4", Quant::Q4K), ("q6", Quant::Q6K)] {
        let GgufTensor::Quantized(w) = f.read(name, &Device::Cpu, &keep).unwrap() else {
            panic!("{name} is quantized");
        };
        assert_eq!(w.quant(), Some(quant));
        let theirs = content.tensor(&mut reader, name, &Device::Cpu).unwrap();
        let want = theirs
            .dequantize(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap();
        assert_eq!(w.unpack(), want.to_vec1::<f32>().unwrap(), "{name}");
        let wide = f.read_f32(name, &Device::Cpu).unwrap();
        assert_eq!(wide.dims(), f.shape(name).unwrap());
    }
    assert_eq!(
        f.read("absent", &Device::Cpu, &keep).unwrap_err().code(),
        "missing-tensor"
    );
}

#[test]
fn a_truncated_file_names_every_tensor_it_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = sample(dir.path());
    let bytes = std::fs::read(&path).unwrap();
    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() - 600]).unwrap();
    let e = GgufFile::open(&cut).unwrap_err();
    let names: Vec<&str> = e.problems().iter().filter_map(|p| p.argument()).collect();
    assert!(names.contains(&"q6"), "{e}");
    assert!(e.problems().iter().all(|p| p.code() == "bad-gguf"), "{e}");
    assert!(e.to_string().contains("cut.gguf") && e.to_string().contains("truncated"));
    // A file cut inside its header, and one that is not GGUF at all.
    std::fs::write(&cut, &bytes[..40]).unwrap();
    assert_eq!(GgufFile::open(&cut).unwrap_err().code(), "bad-gguf");
    std::fs::write(&cut, b"{\"not\": \"gguf\"}").unwrap();
    assert_eq!(GgufFile::open(&cut).unwrap_err().code(), "bad-gguf");
    let gone = GgufFile::open(&dir.path().join("gone.gguf")).unwrap_err();
    assert_eq!(gone.code(), "missing-file");
}

#[test]
fn an_unsupported_type_is_named_with_its_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "q5.gguf",
        &[
            ("fine", values(256, 1), vec![1, 256], GgmlDType::Q8_0),
            ("odd", values(2 * 256, 2), vec![2, 256], GgmlDType::Q5K),
        ],
    );
    let e = GgufFile::open(&path).unwrap_err();
    assert_eq!((e.code(), e.argument()), ("bad-gguf", Some("odd")), "{e}");
    assert!(
        e.to_string().contains("Q5_K") && e.to_string().contains("Q6_K"),
        "{e}"
    );

    // A type id no reader knows (patched over the Q5_K's): named by its number.
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.windows(3).position(|w| w == b"odd").unwrap() + 3;
    // After the name: n_dims (u32), 2 dims (u64 each), then the type (u32).
    let t = at + 4 + 16;
    assert_eq!(bytes[t..t + 4], 13u32.to_le_bytes());
    bytes[t..t + 4].copy_from_slice(&99u32.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let e = GgufFile::open(&path).unwrap_err();
    assert_eq!(e.code(), "bad-gguf");
    assert!(e.to_string().contains("99"), "{e}");
}

#[test]
fn a_quantized_vector_is_refused_when_read() {
    let dir = tempfile::tempdir().unwrap();
    let v = ("v", values(256, 1), vec![256], GgmlDType::Q8_0);
    let path = write(dir.path(), "v.gguf", &[v]);
    let f = GgufFile::open(&path).unwrap();
    let e = f
        .read("v", &Device::Cpu, &LoadOptions::default())
        .unwrap_err();
    assert_eq!((e.code(), e.argument()), ("bad-gguf", Some("v")), "{e}");
}
