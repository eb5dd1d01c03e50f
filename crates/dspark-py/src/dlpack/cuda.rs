//! CUDA tensors across the DLPack boundary, both ways, with no copy and in stream order.
//!
//! Import ([`import`]): the producer's `__dlpack__` gets our stream (`stream=`), so its
//! pending writes are ordered before our reads; the memory is wrapped as a candle tensor
//! ([`dspark::cuda_interop::BorrowedTensor`]) that never frees it.
//!
//! Export ([`DeviceArray`]): a candle CUDA tensor behind `__dlpack__` / `__dlpack_device__`;
//! `__dlpack__(stream=s)` makes the consumer's stream `s` wait for our pending work, and the
//! capsule's deleter drops the tensor (so torch keeps it alive as long as it needs).

use std::ffi::c_void;

use candle_core::{DType, Device, Tensor};
use pyo3::ffi;
use pyo3::prelude::*;

use dspark::Error;
use dspark::cuda_interop::{BorrowedTensor, cuda_device, device_ptr, signal_stream, stream_handle};

use super::abi::{
    DL_CUDA, DLDataType, DLDevice, DLManagedTensor, DlDtype, NAME_LEGACY, RawDLTensor,
};
use super::{DlTensor, dlpack_device};
use crate::errors::{PyDSparkError, guard, retype};

/// A CUDA tensor borrowed from a DLPack producer. Field order matters: the candle view is
/// released before the producer's deleter runs.
pub struct DeviceTensor {
    borrowed: BorrowedTensor,
    _owner: DlTensor,
}

impl DeviceTensor {
    /// The candle tensor over the producer's memory.
    pub fn tensor(&self) -> &Tensor {
        self.borrowed.tensor()
    }
}

fn err(e: Error) -> PyErr {
    PyDSparkError(e).into()
}

/// The CUDA device of `obj` (the argument `name`) when it is a CUDA DLPack producer (`None`
/// for host memory). A producer whose `__dlpack_device__` raises (a torch `meta` tensor) is an
/// `InputError` naming `name`, as on the host path.
pub fn cuda_device_of(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Option<Device>> {
    let device = dlpack_device(obj)
        .map_err(|e| retype(obj.py(), e, name, "could not be exported through DLPack"))?;
    match device {
        Some((DL_CUDA, id)) => {
            let id = usize::try_from(id)
                .map_err(|_| err(Error::invalid("device", format!("negative device id {id}"))))?;
            Ok(Some(cuda_device(id).map_err(err)?))
        }
        _ => Ok(None),
    }
}

/// Borrow CUDA producer `obj` on `device` (see the module docs).
pub fn import(obj: &Bound<'_, PyAny>, name: &str, device: &Device) -> PyResult<DeviceTensor> {
    let stream = stream_handle(device).map_err(err)?;
    let owner = DlTensor::from_py_device(obj, name, Some(stream))?;
    if !owner.is_cuda() {
        return Err(err(Error::DeviceMismatch {
            name: name.to_string(),
            found: "cpu".into(),
            expected: dspark::device::device_name(device),
        }));
    }
    let found = format!("cuda:{}", owner.device().1);
    let expected = dspark::device::device_name(device);
    if found != expected {
        return Err(err(Error::DeviceMismatch {
            name: name.to_string(),
            found,
            expected,
        }));
    }
    let dtype = match owner.dtype() {
        DlDtype::F32 => DType::F32,
        DlDtype::F16 => DType::F16,
        DlDtype::BF16 => DType::BF16,
        DlDtype::I64 => DType::I64,
        DlDtype::U32 => DType::U32,
        DlDtype::I32 => {
            return Err(err(Error::UnsupportedDtype {
                name: name.to_string(),
                message: "int32 on CUDA (use int64)".into(),
            }));
        }
    };
    // SAFETY: `owner` keeps the producer's allocation alive and unreleased until after
    // `borrowed` drops (field order); `describe` checked it is C-contiguous with `numel`
    // elements of `dtype` on this device; the producer ordered its writes before our stream.
    let borrowed =
        unsafe { BorrowedTensor::new(device, owner.data_ptr() as u64, dtype, owner.shape()) }
            .map_err(err)?;
    Ok(DeviceTensor {
        borrowed,
        _owner: owner,
    })
}

/// Integer ids on a CUDA device (int64 or uint32), copied to the host once, with their shape:
/// ids are a few numbers per row, read on the host to be checked against the vocabulary.
pub fn host_ids(
    obj: &Bound<'_, PyAny>,
    name: &str,
    device: &Device,
) -> PyResult<(Vec<i64>, Vec<usize>)> {
    let t = import(obj, name, device)?;
    let shape = t.tensor().dims().to_vec();
    let read = || -> dspark::Result<Option<Vec<i64>>> {
        let flat = t.tensor().flatten_all()?;
        Ok(match flat.dtype() {
            DType::I64 => Some(flat.to_vec1::<i64>()?),
            DType::U32 => Some(flat.to_vec1::<u32>()?.into_iter().map(i64::from).collect()),
            _ => None,
        })
    };
    match read().map_err(err)? {
        Some(values) => Ok((values, shape)),
        None => Err(err(Error::UnsupportedDtype {
            name: name.to_string(),
            message: format!(
                "{:?} is not supported for token ids (expected int64 or uint32 on CUDA)",
                t.tensor().dtype()
            ),
        })),
    }
}

/// A dspark CUDA result, exported through DLPack (`torch.from_dlpack(x)`).
#[pyclass(module = "dspark._native", frozen)]
pub struct DeviceArray {
    tensor: Tensor,
}

impl DeviceArray {
    /// Wrap a CUDA tensor (made contiguous).
    pub fn new(tensor: Tensor) -> PyResult<Self> {
        let tensor = tensor.contiguous().map_err(|e| err(e.into()))?;
        Ok(Self { tensor })
    }
}

struct Export {
    _tensor: Tensor,
    shape: Vec<i64>,
    managed: DLManagedTensor,
}

unsafe extern "C" fn delete_export(m: *mut DLManagedTensor) {
    // SAFETY: `manager_ctx` is the `Box<Export>` leaked in `__dlpack__`; the DLPack contract
    // calls the deleter exactly once.
    unsafe {
        let ctx = (*m).manager_ctx.cast::<Export>();
        drop(Box::from_raw(ctx));
    }
}

unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with our capsule; a consumer renames it when it takes ownership,
    // so a capsule still named `dltensor` was never consumed and we release it here.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, NAME_LEGACY.as_ptr()) == 1 {
            let m =
                ffi::PyCapsule_GetPointer(capsule, NAME_LEGACY.as_ptr()).cast::<DLManagedTensor>();
            if !m.is_null()
                && let Some(d) = (*m).deleter
            {
                d(m);
            }
        } else {
            ffi::PyErr_Clear();
        }
    }
}

fn dl_dtype(dtype: DType) -> PyResult<DLDataType> {
    let (code, bits) = match dtype {
        DType::F32 => (2, 32),
        DType::F16 => (2, 16),
        DType::BF16 => (4, 16),
        DType::I64 => (0, 64),
        DType::U32 => (1, 32),
        DType::U8 => (1, 8),
        other => {
            return Err(err(Error::UnsupportedDtype {
                name: "result".into(),
                message: format!("{other:?} cannot be exported"),
            }));
        }
    };
    Ok(DLDataType {
        code,
        bits,
        lanes: 1,
    })
}

#[pymethods]
impl DeviceArray {
    /// `(2, device_id)`: a CUDA tensor.
    fn __dlpack_device__(&self) -> PyResult<(i32, i32)> {
        match self.tensor.device().location() {
            candle_core::DeviceLocation::Cuda { gpu_id } => Ok((DL_CUDA, gpu_id as i32)),
            _ => Err(err(Error::invalid("result", "not a CUDA tensor"))),
        }
    }

    /// A legacy `dltensor` capsule; `stream` (the consumer's) waits for our pending work.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<i64>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = (max_version, dl_device);
        guard(|| {
            if copy == Some(true) {
                return Err(err(Error::invalid("copy", "copy=True is not supported")));
            }
            let device = self.tensor.device().clone();
            // DLPack: `None` means the legacy default stream (1); `-1` means no sync.
            match stream.unwrap_or(1) {
                -1 => {}
                s if s > 0 => signal_stream(&device, s as usize).map_err(err)?,
                s => {
                    return Err(err(Error::invalid(
                        "stream",
                        format!("{s} is not a stream"),
                    )));
                }
            }
            let ptr = device_ptr(&self.tensor).map_err(err)?;
            let (_, id) = self.__dlpack_device__()?;
            let mut export = Box::new(Export {
                _tensor: self.tensor.clone(),
                shape: self.tensor.dims().iter().map(|&d| d as i64).collect(),
                managed: DLManagedTensor {
                    dl_tensor: RawDLTensor {
                        data: ptr as *mut c_void,
                        device: DLDevice {
                            device_type: DL_CUDA,
                            device_id: id,
                        },
                        ndim: self.tensor.rank() as i32,
                        dtype: dl_dtype(self.tensor.dtype())?,
                        shape: std::ptr::null_mut(),
                        strides: std::ptr::null_mut(),
                        byte_offset: 0,
                    },
                    manager_ctx: std::ptr::null_mut(),
                    deleter: Some(delete_export),
                },
            });
            export.managed.dl_tensor.shape = export.shape.as_mut_ptr();
            let raw = Box::into_raw(export);
            // SAFETY: `raw` is a live `Export`; the capsule owns it until a consumer takes it
            // (then the consumer calls the deleter) or the capsule dies unconsumed.
            unsafe {
                (*raw).managed.manager_ctx = raw.cast::<c_void>();
                let m = std::ptr::addr_of_mut!((*raw).managed);
                let cap = ffi::PyCapsule_New(
                    m.cast::<c_void>(),
                    NAME_LEGACY.as_ptr(),
                    Some(capsule_destructor),
                );
                if cap.is_null() {
                    delete_export(m);
                    return Err(PyErr::fetch(py));
                }
                Ok(Bound::from_owned_ptr(py, cap))
            }
        })
    }
}
