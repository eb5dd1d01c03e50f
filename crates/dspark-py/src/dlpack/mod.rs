//! A small DLPack consumer: borrow CPU tensors from torch, numpy or any `__dlpack__` producer
//! without copying.
//!
//! [`DlTensor::from_py`] calls `obj.__dlpack__(max_version=(1, 0))` (falling back to the legacy
//! `obj.__dlpack__()` for producers that do not take the keyword), takes ownership of the managed
//! tensor by renaming the capsule to `used_dltensor[_versioned]` (so the capsule's own destructor
//! leaves it alone), and calls the producer's deleter when the guard drops. While the guard lives,
//! [`DlTensor::slice`] hands out `&[T]` views of the producer's memory.
//!
//! [`DlTensor::from_py`] accepts only C-contiguous host tensors: anything else is an `InputError`
//! (non-contiguous: `bad-shape`; a CUDA tensor: `device-unavailable`), never a silent copy.
//! [`DlTensor::from_py_device`] also accepts CUDA tensors in builds with the `cuda` feature
//! (`cuda.rs` wraps them as candle tensors without a copy); it passes the consumer stream
//! to `__dlpack__(stream=...)`, so the producer orders its pending writes before our reads.
//!
//! `abi.rs` holds the spec's structs and the capsule ownership (the unsafe core); `cuda.rs`
//! the CUDA import and export (the `cuda` build).

pub(crate) mod abi;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict};

use dspark::Error;
use dspark::sampling::Floats;

use abi::{DL_CPU, DL_CUDA, DL_CUDA_HOST, DL_CUDA_MANAGED, Owner, raw_dtype_name, take_capsule};
pub use abi::{DlDtype, DlElement};

use crate::errors::{PyDSparkError, retype};

/// An owned DLPack tensor: keeps the producer's memory alive until dropped.
///
/// Construct with [`DlTensor::from_py`]; the checks there guarantee a CPU, C-contiguous,
/// aligned buffer of `numel` elements of `dtype` starting at `data`.
pub struct DlTensor {
    /// The managed tensor (its deleter runs when this drops).
    owner: Owner,
    data: *const u8,
    numel: usize,
    dtype: DlDtype,
    shape: Vec<usize>,
    name: String,
    device: (i32, i32),
}

pub(crate) fn input_error(e: Error) -> PyErr {
    PyDSparkError(e).into()
}

/// Ask `obj` for its DLPack device without exporting anything (None when it has no such method).
pub(crate) fn dlpack_device(obj: &Bound<'_, PyAny>) -> PyResult<Option<(i32, i32)>> {
    if !obj.hasattr("__dlpack_device__")? {
        return Ok(None);
    }
    let dev = obj.call_method0("__dlpack_device__")?;
    // Producers return an IntEnum for the device type: convert through `int`.
    let kind: i32 = dev.get_item(0)?.call_method0("__int__")?.extract()?;
    let id: i32 = dev.get_item(1)?.extract()?;
    Ok(Some((kind, id)))
}

fn device_error(name: &str, device: (i32, i32), cuda_ok: bool) -> PyErr {
    let (kind, id) = device;
    let message = match kind {
        DL_CUDA | DL_CUDA_MANAGED if !dspark::device::cuda_compiled() => {
            "this dspark build has no CUDA support (CUDA tensors are not supported in this \
             build; install the CUDA wheel, see the README's GPU build, or move to CPU)"
        }
        DL_CUDA_MANAGED => "CUDA managed memory is not supported; move to CPU or a cuda device",
        DL_CUDA if !cuda_ok => "this argument is read on the host; move to CPU",
        _ => {
            return input_error(Error::invalid(
                name,
                format!("device type {kind} is not supported; move the tensor to CPU"),
            ));
        }
    };
    input_error(Error::DeviceUnavailable {
        name: name.to_string(),
        device: format!("cuda:{id}"),
        message: message.to_string(),
    })
}

/// Refuse torch tensor kinds whose DLPack export would be wrong or impossible: the meta device
/// (no data), sparse or nested layouts, and the lazy conjugate / negative bits (DLPack has no
/// flag for them, so the buffer would be read as if the bit were clear). The Python front
/// resolves the bits (`resolve_neg()` / `resolve_conj()`) before calling the native kernels.
fn check_torch_kind(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<()> {
    let module = obj
        .get_type()
        .module()
        .map(|m| m.to_string())
        .unwrap_or_default();
    if module.split('.').next() != Some("torch") {
        return Ok(());
    }
    let flag = |attr: &str, call: bool| -> bool {
        let Ok(v) = obj.getattr(attr) else {
            return false;
        };
        let v = if call { v.call0() } else { Ok(v) };
        v.and_then(|v| v.is_truthy()).unwrap_or(false)
    };
    let refuse = |what: &str| Err(input_error(Error::invalid(name, what.to_string())));
    if flag("is_meta", false) {
        return refuse("a tensor on the `meta` device has no data");
    }
    if flag("is_sparse", false) || flag("is_sparse_csr", false) {
        return refuse("sparse tensors are not supported; call .to_dense() first");
    }
    if flag("is_nested", false) {
        return refuse("nested tensors are not supported");
    }
    if flag("is_neg", true) {
        return refuse(
            "the tensor carries the lazy negative bit (torch._neg_view); call .resolve_neg() first",
        );
    }
    if flag("is_conj", true) {
        return refuse("the tensor carries the lazy conjugate bit; call .resolve_conj() first");
    }
    if let Ok(layout) = obj.getattr("layout")
        && let Ok(text) = layout.str()
        && text != "torch.strided"
    {
        return refuse(&format!(
            "layout {text} is not supported (need torch.strided)"
        ));
    }
    Ok(())
}

impl DlTensor {
    /// Borrow `obj` (anything with `__dlpack__`) as a CPU, C-contiguous tensor.
    ///
    /// `name` is the argument name used in error messages. Every failure is an `InputError`
    /// naming it, including exceptions raised by the producer's own `__dlpack__`.
    pub fn from_py(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Self> {
        let py = obj.py();
        Self::from_py_inner(obj, name, None)
            .map_err(|e| retype(py, e, name, "could not be exported through DLPack"))
    }

    /// Like [`DlTensor::from_py`], but a CUDA tensor is accepted (in builds with the `cuda`
    /// feature): `stream` is the consumer stream passed to `__dlpack__` for CUDA producers.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub fn from_py_device(
        obj: &Bound<'_, PyAny>,
        name: &str,
        stream: Option<usize>,
    ) -> PyResult<Self> {
        let py = obj.py();
        Self::from_py_inner(obj, name, Some(stream))
            .map_err(|e| retype(py, e, name, "could not be exported through DLPack"))
    }

    /// `(DLPack device type, device id)`: `(1, 0)` for host memory, `(2, n)` for `cuda:n`.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub fn device(&self) -> (i32, i32) {
        self.device
    }

    /// Whether the data lives on a CUDA device (not readable through [`DlTensor::slice`]).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub fn is_cuda(&self) -> bool {
        self.device.0 == DL_CUDA
    }

    fn from_py_inner(
        obj: &Bound<'_, PyAny>,
        name: &str,
        cuda_stream: Option<Option<usize>>,
    ) -> PyResult<Self> {
        let cuda_ok = cuda_stream.is_some() && dspark::device::cuda_compiled();
        let py = obj.py();
        if !obj.hasattr("__dlpack__")? {
            return Err(input_error(Error::UnsupportedDtype {
                name: name.to_string(),
                message: format!(
                    "expected a tensor or array implementing __dlpack__ (numpy, torch), got {}",
                    obj.get_type().name()?
                ),
            }));
        }
        check_torch_kind(obj, name)?;
        let device = dlpack_device(obj)?;
        if let Some((kind, id)) = device
            && kind != DL_CPU
            && kind != DL_CUDA_HOST
            && !(kind == DL_CUDA && cuda_ok)
        {
            return Err(device_error(name, (kind, id), cuda_ok));
        }
        let kwargs = PyDict::new(py);
        kwargs.set_item("max_version", (1u32, 0u32))?;
        if let (Some((DL_CUDA, _)), Some(Some(stream))) = (device, cuda_stream) {
            kwargs.set_item("stream", stream)?;
        }
        let capsule = match obj.call_method("__dlpack__", (), Some(&kwargs)) {
            Ok(c) => c,
            Err(e) if e.is_instance_of::<PyTypeError>(py) => obj.call_method0("__dlpack__")?,
            Err(e) => return Err(e),
        };
        let capsule = capsule.cast_into::<PyCapsule>().map_err(|_| {
            input_error(Error::invalid(
                name,
                "__dlpack__ did not return a PyCapsule",
            ))
        })?;
        let owner = take_capsule(&capsule, name)?;
        // From here on `guard` owns the managed tensor: any early return calls the deleter.
        let mut guard = DlTensor {
            owner,
            data: std::ptr::null(),
            numel: 0,
            dtype: DlDtype::F32,
            shape: Vec::new(),
            name: name.to_string(),
            device: (DL_CPU, 0),
        };
        guard.describe(cuda_ok)?;
        Ok(guard)
    }

    /// Validate the raw tensor and fill in `data`, `numel`, `dtype`, `shape`.
    fn describe(&mut self, cuda_ok: bool) -> PyResult<()> {
        let name = self.name.clone();
        let raw = self.owner.raw();
        let device = (raw.device.device_type, raw.device.device_id);
        let host = device.0 == DL_CPU || device.0 == DL_CUDA_HOST;
        let cuda = device.0 == DL_CUDA && cuda_ok;
        if !host && !cuda {
            return Err(device_error(&name, device, cuda_ok));
        }
        let dtype = DlDtype::from_raw(raw.dtype).ok_or_else(|| {
            input_error(Error::UnsupportedDtype {
                name: name.clone(),
                message: format!(
                    "{} is not supported (expected float32, float16, bfloat16, int32, int64 or uint32)",
                    raw_dtype_name(raw.dtype)
                ),
            })
        })?;
        let ndim = usize::try_from(raw.ndim)
            .map_err(|_| input_error(Error::bad_shape(&name, "negative ndim")))?;
        let (shape, strides) = raw.shape_and_strides(ndim);
        let mut dims = Vec::with_capacity(ndim);
        for &d in shape {
            dims.push(
                usize::try_from(d)
                    .map_err(|_| input_error(Error::bad_shape(&name, "negative dimension")))?,
            );
        }
        let numel = dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
        let numel =
            numel.ok_or_else(|| input_error(Error::bad_shape(&name, "element count overflows")))?;
        if let Some(strides) = strides
            && numel > 0
        {
            let mut expected: i64 = 1;
            for (i, (&d, &s)) in dims.iter().zip(strides).enumerate().rev() {
                if d != 1 && s != expected {
                    return Err(input_error(Error::bad_shape(
                        &name,
                        format!(
                            "must be C-contiguous (shape {dims:?}, strides {strides:?}: dim {i} \
                             has stride {s}, expected {expected}); call .contiguous() or \
                             np.ascontiguousarray() first"
                        ),
                    )));
                }
                expected = expected.saturating_mul(d as i64);
            }
        }
        let data = if numel == 0 || raw.data.is_null() {
            std::ptr::null()
        } else {
            let offset = usize::try_from(raw.byte_offset)
                .map_err(|_| input_error(Error::bad_shape(&name, "byte_offset overflows")))?;
            let p = raw.first_element(offset);
            if !(p as usize).is_multiple_of(dtype.size()) {
                return Err(input_error(Error::bad_shape(
                    &name,
                    format!("data pointer is not aligned for {}", dtype.name()),
                )));
            }
            p
        };
        if numel > 0 && data.is_null() {
            return Err(input_error(Error::bad_shape(&name, "null data pointer")));
        }
        self.data = data;
        self.numel = numel;
        self.dtype = dtype;
        self.shape = dims;
        self.device = if host { (DL_CPU, 0) } else { device };
        Ok(())
    }

    /// Element type.
    pub fn dtype(&self) -> DlDtype {
        self.dtype
    }

    /// Shape (row-major).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.numel
    }

    /// The argument name used in error messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The start of the data (borrowed by the CUDA path; read by zero-copy tests); null for
    /// empty tensors.
    #[cfg(any(feature = "test-hooks", feature = "cuda"))]
    pub fn data_ptr(&self) -> usize {
        self.data as usize
    }

    /// The values of a float tensor (f32, f16 or bf16) as engine [`Floats`] — the one place
    /// the glue dispatches on a float dtype; any other dtype is `unsupported-dtype`.
    pub fn floats(&self) -> PyResult<Floats<'_>> {
        if let Some(s) = self.slice::<f32>() {
            return Ok(Floats::F32(s));
        }
        if let Some(s) = self.slice::<half::f16>() {
            return Ok(Floats::F16(s));
        }
        if let Some(s) = self.slice::<half::bf16>() {
            return Ok(Floats::BF16(s));
        }
        Err(input_error(Error::UnsupportedDtype {
            name: self.name.clone(),
            message: format!(
                "{} is not supported (expected float32, float16 or bfloat16)",
                self.dtype.name()
            ),
        }))
    }

    /// Borrow the elements as `&[T]`; `None` when `T` is not this tensor's dtype.
    pub fn slice<T: DlElement>(&self) -> Option<&[T]> {
        if T::DTYPE != self.dtype || self.device.0 != DL_CPU {
            return None;
        }
        if self.numel == 0 {
            return Some(&[]);
        }
        // SAFETY: `describe` checked that `data` is non-null, aligned for `T` (same size as
        // `dtype`), on the CPU, and that the buffer is C-contiguous with `numel` elements, so
        // `numel * size_of::<T>()` bytes from `data` belong to the producer's allocation. That
        // memory stays alive until `self` drops (we hold the managed tensor and call its
        // deleter only in `Drop`), and the returned borrow is tied to `&self`. The producer may
        // in principle mutate it concurrently from another thread; callers hold this view only
        // for the duration of one kernel call, the same contract numpy/torch extensions follow.
        Some(unsafe { std::slice::from_raw_parts(self.data.cast::<T>(), self.numel) })
    }
}
