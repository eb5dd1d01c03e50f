//! Reading the tensor arguments of the kernel fronts: fixed-rank shapes and integer ids (float
//! values: [`crate::view::with_floats`]).

use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};

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
