//! Counts of what the device-generic path costs: host ↔ device transfers and candle ops.
//!
//! On a GPU every candle op is a kernel launch with ~20 µs of host time, and every transfer a
//! synchronising copy, so the drafter's passes are judged by how many of each they issue and
//! whether that depends on the batch size. This module counts them on the CPU too (under
//! `DSPARK_KERNEL_PATH=tensor` the CPU runs exactly the ops a CUDA device would), so tests
//! can pin the counts without a GPU.
//!
//! - **Transfers** are counted where dspark makes them, through [`upload`] and the
//!   `download_*` helpers, per thread: a pass runs on its caller's thread on the tensor path.
//!   A tensor on the host fast path (CPU, `DSPARK_KERNEL_PATH` unset) is not counted: nothing
//!   crosses there.
//! - **Ops** are read from candle's tensor ids ([`tensor_ops`]): every op, view or new tensor
//!   takes the next id of one process-wide counter, so the difference between two readings is
//!   the number of tensors made in between, by every thread of the process (count in a
//!   process that runs nothing else meanwhile).

use std::cell::Cell;

use candle_core::{Device, Shape, Tensor, WithDType};

use crate::device::fast_on;
use crate::error::Result;

/// Host ↔ device transfers and attention calls made on this thread since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Host → device copies.
    pub uploads: usize,
    /// Device → host copies.
    pub downloads: usize,
    /// Batched attention calls on the device-generic path
    /// ([`crate::nn::attention::batched_attention`]).
    pub attentions: usize,
}

impl std::ops::Sub for Counts {
    type Output = Self;
    fn sub(self, rhs: Self) -> Self {
        Self {
            uploads: self.uploads.saturating_sub(rhs.uploads),
            downloads: self.downloads.saturating_sub(rhs.downloads),
            attentions: self.attentions.saturating_sub(rhs.attentions),
        }
    }
}

thread_local! {
    static COUNTS: Cell<Counts> = const {
        Cell::new(Counts {
            uploads: 0,
            downloads: 0,
            attentions: 0,
        })
    };
}

/// This thread's counts so far (subtract two readings for a call's).
pub fn counts() -> Counts {
    COUNTS.with(Cell::get)
}

/// Count one batched attention call.
pub(crate) fn attention() {
    bump(|c| c.attentions += 1);
}

fn bump(f: impl FnOnce(&mut Counts)) {
    COUNTS.with(|c| {
        let mut t = c.get();
        f(&mut t);
        c.set(t);
    });
}

/// `values` as a tensor of `shape` on `device`: one upload (counted off the host fast path).
pub fn upload<D: WithDType, S: Into<Shape>>(
    values: Vec<D>,
    shape: S,
    device: &Device,
) -> Result<Tensor> {
    if !fast_on(device) {
        bump(|t| t.uploads += 1);
    }
    Ok(Tensor::from_vec(values, shape, device)?)
}

/// `t` on `device`: one upload when it comes from the host to another device (counted as
/// [`upload`]'s), a no-op when it is there already.
pub fn to_device(t: &Tensor, device: &Device) -> Result<Tensor> {
    if t.device().same_device(device) {
        return Ok(t.clone());
    }
    if t.device().is_cpu() {
        bump(|c| c.uploads += 1);
    }
    Ok(t.to_device(device)?)
}

/// The values of `t` (any shape, converted to f32) on the host: one download (counted off the
/// host fast path).
pub fn download_f32(t: &Tensor) -> Result<Vec<f32>> {
    if !fast_on(t.device()) {
        bump(|c| c.downloads += 1);
    }
    let t = t.flatten_all()?.to_dtype(candle_core::DType::F32)?;
    Ok(t.to_device(&Device::Cpu)?.to_vec1::<f32>()?)
}

/// The next candle tensor id of this process: subtract two readings for the number of tensors
/// (ops, views and new tensors) made in between, by every thread.
pub fn tensor_ops() -> usize {
    // The id is private to candle; its `Debug` form is `TensorId(n)`. Reading it makes one
    // tensor, which the returned value already counts past.
    let probe = Tensor::zeros((), candle_core::DType::U8, &Device::Cpu);
    let Ok(probe) = probe else { return 0 };
    let text = format!("{:?}", probe.id());
    text.trim_start_matches("TensorId(")
        .trim_end_matches(')')
        .parse::<usize>()
        .map_or(0, |n| n + 1)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn tensor_ops_advances_with_ops() {
        let a = tensor_ops();
        let b = tensor_ops();
        assert!(b > a, "each reading makes a tensor");
    }
}
