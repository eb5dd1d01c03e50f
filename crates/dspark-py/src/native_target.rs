//! `dspark._native.NativeTarget`: the engine's candle Qwen3 causal LM
//! (`dspark::models::qwen3::Qwen3Target`), for `dspark.NativeTarget`.

use std::sync::Arc;

use numpy::{PyArray1, PyArray2, PyArrayMethods};
use pyo3::prelude::*;

use dspark::device::{device_name, parse_device};
use dspark::models::qwen3::Qwen3Target;
use dspark::speculator::{LogitRows, TargetInput, TargetModel};
use dspark::{Error, LoadOptions};

use crate::args;
use crate::errors::{err, guard};

/// A native Qwen3 target (weights in candle, on the CPU or a CUDA device).
#[pyclass(name = "NativeTarget", module = "dspark._native", frozen)]
pub struct PyNativeTarget {
    pub(crate) inner: Arc<Qwen3Target>,
}

#[pymethods]
impl PyNativeTarget {
    /// Load an HF `Qwen3ForCausalLM` directory (`config.json` + safetensors), or a Qwen3 GGUF
    /// file (its tensors' types kept: quantized maps as their blocks), onto `device`
    /// (`cpu`, `cuda` or `cuda:N`), its weight matrices kept in `dtype` (`float32`,
    /// `bfloat16`, `float16`; `q8_0` / `q4_k`: the layers' maps in 8-bit blocks or 4-bit
    /// super-blocks; `None`: the
    /// checkpoint's), its KV cache in `kv_dtype` (`float32`, `float16`, `bfloat16`; `None`: the
    /// engine's default).
    #[staticmethod]
    #[pyo3(signature = (path, device = "cpu", dtype = None, kv_dtype = None))]
    fn load(
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        device: &str,
        dtype: Option<&str>,
        kv_dtype: Option<&str>,
    ) -> PyResult<Self> {
        guard(|| {
            let path = args::path(path, "path")?;
            let device = parse_device("device", device).map_err(err)?;
            let options = LoadOptions::with_dtype_name(dtype)
                .and_then(|o| o.with_kv_dtype_name(kv_dtype))
                .map_err(err)?;
            let inner = py
                .detach(|| Qwen3Target::open(&path, &device, options))
                .map_err(err)?;
            Ok(Self {
                inner: Arc::new(inner),
            })
        })
    }

    /// `V_t`.
    #[getter]
    fn vocab_size(&self) -> PyResult<usize> {
        guard(|| Ok(self.inner.vocab_size()))
    }

    /// Where the weights live: `cpu` or `cuda:N`.
    #[getter]
    fn device(&self) -> PyResult<String> {
        guard(|| Ok(device_name(&self.inner.device())))
    }

    /// The element type of its KV caches (`float32`, `float16`, `bfloat16`).
    #[getter]
    fn kv_dtype(&self) -> PyResult<&'static str> {
        guard(|| Ok(self.inner.kv_dtype().as_str()))
    }

    /// The dtype the layers' weight matrices are kept in (`float32`, `bfloat16`, `float16`, or
    /// `q8_0` / `q4_k` when quantized at load).
    #[getter]
    fn weight_dtype(&self) -> PyResult<&'static str> {
        guard(|| {
            Ok(match self.inner.quant() {
                Some(q) => q.as_str(),
                None => self.inner.weight_dtype().as_str(),
            })
        })
    }

    /// Bytes of weights one forward step reads (the decode floor's numerator).
    #[getter]
    fn weight_bytes_per_step(&self) -> PyResult<usize> {
        guard(|| Ok(self.inner.weight_bytes_per_step()))
    }

    /// Number of decoder layers.
    #[getter]
    fn num_hidden_layers(&self) -> PyResult<usize> {
        guard(|| Ok(self.inner.num_hidden_layers()))
    }

    /// Hidden width.
    #[getter]
    fn hidden_size(&self) -> PyResult<usize> {
        guard(|| Ok(self.inner.hidden_size()))
    }

    /// Logits `[S, V_t]` (float32) of every position of one sequence, from an empty cache.
    fn logits<'py>(
        &self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        guard(|| {
            let v = self.inner.vocab_size();
            let ids = args::ids_in_vocab(&args::ids_1d(ids, "ids")?, "ids", v)?;
            if ids.is_empty() {
                return Err(err(Error::invalid("ids", "empty: need at least one token")));
            }
            let inner = &self.inner;
            let values = py
                .detach(|| -> dspark::Result<Vec<f32>> {
                    let mut cache = inner.new_cache(1)?;
                    let input = TargetInput {
                        tokens: &ids,
                        width: ids.len(),
                        num_tokens: &[ids.len()],
                        logits: LogitRows::All,
                    };
                    let out = inner.forward(&mut cache, &input, &[])?;
                    Ok(out
                        .logits
                        .to_dtype(candle_core::DType::F32)?
                        .flatten_all()?
                        .to_vec1::<f32>()?)
                })
                .map_err(err)?;
            PyArray1::from_vec(py, values).reshape([ids.len(), v])
        })
    }

    fn __repr__(&self) -> PyResult<String> {
        guard(|| {
            Ok(format!(
                "NativeTarget(layers={}, hidden={}, vocab={})",
                self.inner.num_hidden_layers(),
                self.inner.hidden_size(),
                self.inner.vocab_size()
            ))
        })
    }
}

/// What a GGUF model file carries beside its tensors, as the files a model directory holds:
/// `{"config": {...}, "tokenizer": "<tokenizer.json text>" | None, "tokenizer_error": str |
/// None, "tokenizer_config": {...}, "generation_config": {...}}`.
#[pyfunction]
pub fn gguf_side_files<'py>(
    py: Python<'py>,
    path: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    guard(|| {
        let path = args::path(path, "path")?;
        let side = py
            .detach(|| dspark::models::gguf_files::SideFiles::read(&path))
            .map_err(err)?;
        let (tokenizer, error) = match &side.tokenizer {
            Ok(t) => (
                serde_json::Value::String(t.to_string()),
                serde_json::Value::Null,
            ),
            Err(e) => (
                serde_json::Value::Null,
                serde_json::Value::String(e.clone()),
            ),
        };
        let value = serde_json::json!({
            "config": side.config,
            "tokenizer": tokenizer,
            "tokenizer_error": error,
            "tokenizer_config": side.tokenizer_config,
            "generation_config": side.generation_config,
        });
        crate::json::to_py(py, &value)
    })
}
