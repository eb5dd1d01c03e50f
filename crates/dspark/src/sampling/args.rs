//! Reading the tensor arguments of the kernel fronts: float values borrowed from contiguous CPU
//! storage (f32, f16, bf16; other tensors copied there once), fixed-rank shapes, integer ids.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, Device, Storage, Tensor};

use crate::error::{Error, Result};
use crate::view::Floats;

/// `t` as a contiguous CPU tensor (a copy only when it is not one already).
fn on_cpu(t: &Tensor) -> Result<Tensor> {
    let t = if t.device().is_cpu() {
        t.clone()
    } else {
        t.to_device(&Device::Cpu)?
    };
    Ok(t.contiguous()?)
}

/// Run `f` on a borrowed view of `t`'s values (f32, f16 or bf16).
pub(super) fn with_floats<R>(
    t: &Tensor,
    name: &str,
    f: impl FnOnce(Floats<'_>) -> Result<R>,
) -> Result<R> {
    let t = on_cpu(t)?;
    let (storage, layout) = t.storage_and_layout();
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| Error::bad_shape(name, "not contiguous after a contiguous copy"))?;
    let unsupported = |dtype: DType| Error::UnsupportedDtype {
        name: name.to_string(),
        message: format!("{dtype:?} (need f32, f16 or bf16)"),
    };
    match &*storage {
        Storage::Cpu(CpuStorage::F32(v)) => f(Floats::F32(&v[start..end])),
        Storage::Cpu(CpuStorage::F16(v)) => f(Floats::F16(&v[start..end])),
        Storage::Cpu(CpuStorage::BF16(v)) => f(Floats::BF16(&v[start..end])),
        Storage::Cpu(other) => Err(unsupported(other.dtype())),
        _ => Err(Error::invalid(
            name,
            "tensor is not on the CPU after moving it there",
        )),
    }
}

/// The dims of `t` as `[usize; N]`, or `bad-shape` naming `what` was expected.
pub(super) fn dims<const N: usize>(t: &Tensor, name: &str, what: &str) -> Result<[usize; N]> {
    <[usize; N]>::try_from(t.dims())
        .map_err(|_| Error::bad_shape(name, format!("shape {:?}, expected {what}", t.dims())))
}

/// `unsupported-dtype` unless `t` holds token ids (u8, u32 or i64; i32 too on a device).
pub(super) fn check_ids(t: &Tensor, name: &str) -> Result<()> {
    match t.dtype() {
        DType::U8 | DType::U32 | DType::I64 => Ok(()),
        DType::I32 if !t.device().is_cpu() => Ok(()),
        other => Err(Error::UnsupportedDtype {
            name: name.into(),
            message: format!("{other:?} (need an integer dtype: u8, u32 or i64)"),
        }),
    }
}

/// Token ids of an integer tensor (u8/u32/i64), flattened.
pub(super) fn ids(t: &Tensor, name: &str) -> Result<Vec<i64>> {
    check_ids(t, name)?;
    Ok(t.flatten_all()?
        .to_dtype(DType::I64)?
        .to_device(&Device::Cpu)?
        .to_vec1::<i64>()?)
}
