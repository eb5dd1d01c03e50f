//! The DLPack ABI: the `#[repr(C)]` structs of the spec (legacy and versioned managed
//! tensors), the dtype codes, and the capsule protocol — taking ownership of the managed tensor
//! by renaming its capsule to `used_dltensor[_versioned]` and calling the producer's deleter
//! exactly once, when [`Owner`] drops. The unsafe core of the DLPack layer; the policy (which
//! tensors are accepted, errors) is in the parent module.

use std::ffi::{CStr, c_void};
use std::ptr::NonNull;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods};

use dspark::Error;

use super::input_error;

/// `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct DLDevice {
    pub(crate) device_type: i32,
    pub(crate) device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct DLDataType {
    pub(crate) code: u8,
    pub(crate) bits: u8,
    pub(crate) lanes: u16,
}

/// `DLTensor`: the plain description shared by both managed forms.
#[repr(C)]
pub(crate) struct RawDLTensor {
    pub(crate) data: *mut c_void,
    pub(crate) device: DLDevice,
    pub(crate) ndim: i32,
    pub(crate) dtype: DLDataType,
    pub(crate) shape: *mut i64,
    pub(crate) strides: *mut i64,
    pub(crate) byte_offset: u64,
}

/// `DLManagedTensor` (the legacy, unversioned capsule payload, name `"dltensor"`).
#[repr(C)]
pub(crate) struct DLManagedTensor {
    pub(crate) dl_tensor: RawDLTensor,
    pub(crate) manager_ctx: *mut c_void,
    pub(crate) deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `DLPackVersion`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct DLPackVersion {
    major: u32,
    minor: u32,
}

/// `DLManagedTensorVersioned` (DLPack ≥ 1.0, capsule name `"dltensor_versioned"`).
#[repr(C)]
pub(crate) struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: RawDLTensor,
}

pub(crate) const DL_CPU: i32 = 1;
pub(crate) const DL_CUDA: i32 = 2;
pub(crate) const DL_CUDA_HOST: i32 = 3;
pub(crate) const DL_CUDA_MANAGED: i32 = 13;

pub(crate) const NAME_LEGACY: &CStr = c"dltensor";
const NAME_LEGACY_USED: &CStr = c"used_dltensor";
const NAME_VERSIONED: &CStr = c"dltensor_versioned";
const NAME_VERSIONED_USED: &CStr = c"used_dltensor_versioned";

/// Element types accepted from DLPack producers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DlDtype {
    /// `float32`.
    F32,
    /// `float16`.
    F16,
    /// `bfloat16` (torch only: numpy has no bf16).
    BF16,
    /// `int32`.
    I32,
    /// `int64`.
    I64,
    /// `uint32`.
    U32,
}

impl DlDtype {
    pub(crate) fn from_raw(dt: DLDataType) -> Option<Self> {
        if dt.lanes != 1 {
            return None;
        }
        Some(match (dt.code, dt.bits) {
            (2, 32) => DlDtype::F32,
            (2, 16) => DlDtype::F16,
            (4, 16) => DlDtype::BF16,
            (0, 32) => DlDtype::I32,
            (0, 64) => DlDtype::I64,
            (1, 32) => DlDtype::U32,
            _ => return None,
        })
    }

    /// The numpy/torch spelling, e.g. `"float32"`.
    pub fn name(self) -> &'static str {
        match self {
            DlDtype::F32 => "float32",
            DlDtype::F16 => "float16",
            DlDtype::BF16 => "bfloat16",
            DlDtype::I32 => "int32",
            DlDtype::I64 => "int64",
            DlDtype::U32 => "uint32",
        }
    }

    pub(crate) fn size(self) -> usize {
        match self {
            DlDtype::F16 | DlDtype::BF16 => 2,
            DlDtype::F32 | DlDtype::I32 | DlDtype::U32 => 4,
            DlDtype::I64 => 8,
        }
    }
}

pub(crate) fn raw_dtype_name(dt: DLDataType) -> String {
    let kind = match dt.code {
        0 => "int",
        1 => "uint",
        2 => "float",
        4 => "bfloat",
        5 => "complex",
        6 => "bool",
        _ => "opaque",
    };
    if dt.lanes == 1 {
        format!("{kind}{}", dt.bits)
    } else {
        format!("{kind}{}x{}", dt.bits, dt.lanes)
    }
}

/// A Rust element type that a [`DlDtype`] can be viewed as.
pub trait DlElement: Copy + Send + Sync + 'static {
    /// The matching DLPack dtype.
    const DTYPE: DlDtype;
}

impl DlElement for f32 {
    const DTYPE: DlDtype = DlDtype::F32;
}

impl DlElement for half::f16 {
    const DTYPE: DlDtype = DlDtype::F16;
}

impl DlElement for half::bf16 {
    const DTYPE: DlDtype = DlDtype::BF16;
}

impl DlElement for i32 {
    const DTYPE: DlDtype = DlDtype::I32;
}

impl DlElement for i64 {
    const DTYPE: DlDtype = DlDtype::I64;
}

impl DlElement for u32 {
    const DTYPE: DlDtype = DlDtype::U32;
}

impl RawDLTensor {
    /// The `ndim` dimensions and, when the producer gives them, the strides (in elements).
    pub(crate) fn shape_and_strides(&self, ndim: usize) -> (&[i64], Option<&[i64]>) {
        if ndim == 0 {
            return (&[], None);
        }
        // SAFETY: DLPack guarantees `shape` points at `ndim` int64 values and `strides` is
        // either null or points at `ndim` int64 values, valid while the tensor is alive (the
        // borrow is tied to `&self`, which lives inside the managed tensor we own).
        unsafe {
            (
                std::slice::from_raw_parts(self.shape, ndim),
                (!self.strides.is_null()).then(|| std::slice::from_raw_parts(self.strides, ndim)),
            )
        }
    }

    /// The address of the first element: `data + byte_offset` (`data` is non-null, the
    /// offset within the producer's buffer per the DLPack contract).
    pub(crate) fn first_element(&self, byte_offset: usize) -> *const u8 {
        self.data
            .cast::<u8>()
            .cast_const()
            .wrapping_add(byte_offset)
    }
}

/// The managed tensor we own, taken out of a DLPack capsule: dropping it calls the producer's
/// deleter, exactly once.
pub(crate) enum Owner {
    Legacy(NonNull<DLManagedTensor>),
    Versioned(NonNull<DLManagedTensorVersioned>),
}

impl Owner {
    /// The tensor description inside the managed tensor.
    pub(crate) fn raw(&self) -> &RawDLTensor {
        // SAFETY: the managed tensor is alive (we own it until drop) and its DLTensor fields
        // are initialised by the producer, per the DLPack contract.
        unsafe {
            match self {
                Owner::Legacy(p) => &(*p.as_ptr()).dl_tensor,
                Owner::Versioned(p) => &(*p.as_ptr()).dl_tensor,
            }
        }
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        // SAFETY: the pointer came from a capsule we renamed to `used_*`, so nobody else calls
        // the deleter; we call it exactly once, here. Producers' deleters take the GIL themselves
        // when they need it (numpy, torch), so dropping while detached is also sound.
        unsafe {
            match self {
                Owner::Legacy(p) => {
                    if let Some(deleter) = (*p.as_ptr()).deleter {
                        deleter(p.as_ptr());
                    }
                }
                Owner::Versioned(p) => {
                    if let Some(deleter) = (*p.as_ptr()).deleter {
                        deleter(p.as_ptr());
                    }
                }
            }
        }
    }
}

/// Take ownership of the managed tensor inside a fresh DLPack capsule.
pub(crate) fn take_capsule(capsule: &Bound<'_, PyCapsule>, name: &str) -> PyResult<Owner> {
    let owner = if capsule.is_valid_checked(Some(NAME_VERSIONED)) {
        let ptr = capsule.pointer_checked(Some(NAME_VERSIONED))?;
        let ptr = ptr.cast::<DLManagedTensorVersioned>();
        // SAFETY: a valid `dltensor_versioned` capsule holds a `DLManagedTensorVersioned`.
        let version = unsafe { (*ptr.as_ptr()).version };
        rename(capsule, NAME_VERSIONED_USED)?;
        let owner = Owner::Versioned(ptr);
        if version.major != 1 {
            // Different ABI: the layout after `version`/`manager_ctx`/`deleter` is unknown,
            // but those three fields are fixed by the spec, so the deleter is safe to call.
            drop(owner);
            return Err(input_error(Error::invalid(
                name,
                format!(
                    "DLPack version {}.{} is not supported (need 1.x)",
                    version.major, version.minor
                ),
            )));
        }
        owner
    } else if capsule.is_valid_checked(Some(NAME_LEGACY)) {
        let ptr = capsule.pointer_checked(Some(NAME_LEGACY))?;
        rename(capsule, NAME_LEGACY_USED)?;
        Owner::Legacy(ptr.cast::<DLManagedTensor>())
    } else {
        return Err(input_error(Error::invalid(
            name,
            "__dlpack__ returned a capsule that is neither `dltensor` nor `dltensor_versioned` \
             (already consumed?)",
        )));
    };
    Ok(owner)
}

fn rename(capsule: &Bound<'_, PyCapsule>, new: &'static CStr) -> PyResult<()> {
    // SAFETY: `capsule` is a live capsule object; `new` is a static C string, so the name
    // pointer the capsule keeps stays valid forever. The GIL is held (`Bound`).
    let rc = unsafe { ffi::PyCapsule_SetName(capsule.as_ptr(), new.as_ptr()) };
    if rc != 0 {
        return Err(PyErr::fetch(capsule.py()));
    }
    Ok(())
}
