//! dspark's own CUDA kernels: PTX built by `build.rs` from `crates/dspark-kernels/kernels/*.cu`.
//!
//! Each `kernels/NAME.cu` is compiled (`nvcc --ptx`, `compute_$CUDA_COMPUTE_CAP`) into
//! `$OUT_DIR/NAME.ptx` and embedded here as one [`PtxModule`]. A custom op's `cuda_fwd` loads
//! its function with [`PtxModule::func`] (candle's `CudaDevice::get_or_load_custom_func`, which
//! caches the module per device), pushes its arguments on a builder from candle's stream
//! (`CudaDevice::cuda_stream().launch_builder`) and launches there.

use candle_core::CudaDevice;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, LaunchConfig};

/// One embedded PTX module (one `.cu` file).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PtxModule {
    /// The cache key under which candle keeps the loaded module (unique per module).
    pub name: &'static str,
    /// The PTX text.
    pub ptx: &'static str,
}

/// `kernels/mask.cu`: padded vocabulary columns to `-inf`.
pub(crate) const MASK: PtxModule = PtxModule {
    name: "dspark-mask",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/mask.ptx")),
};

/// `kernels/markov_bias.cu`: the per-slot Markov bias.
pub(crate) const MARKOV_BIAS: PtxModule = PtxModule {
    name: "dspark-markov-bias",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/markov_bias.ptx")),
};

impl PtxModule {
    /// Load `function` of this module on `dev` (the module is loaded once per device).
    pub(crate) fn func(
        &self,
        dev: &CudaDevice,
        function: &str,
    ) -> candle_core::Result<CudaFunction> {
        Ok(dev
            .get_or_load_custom_func(function, self.name, self.ptx)?
            .into_cuda_function())
    }
}

/// Threads per block of the element-wise and warp-per-output kernels.
pub(crate) const BLOCK: u32 = 256;

/// Upper bound on blocks for grid-stride kernels (enough to fill any current GPU).
const MAX_BLOCKS: usize = 1 << 16;

/// A grid-stride launch over `work` items with `per_block` items per block pass; `None` when
/// there is no work (a zero-sized grid is a launch error).
pub(crate) fn grid_stride(work: usize, per_block: usize) -> Option<LaunchConfig> {
    if work == 0 {
        return None;
    }
    let blocks = work.div_ceil(per_block.max(1)).min(MAX_BLOCKS);
    Some(LaunchConfig {
        grid_dim: (u32::try_from(blocks).unwrap_or(u32::MAX), 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_is_embedded_with_its_entries() {
        for (m, entries) in [
            (
                MASK,
                &[
                    "dspark_mask_padded_b16",
                    "dspark_mask_padded_b32",
                    "dspark_mask_padded_b64",
                ][..],
            ),
            (
                MARKOV_BIAS,
                &[
                    "dspark_markov_bias_f32",
                    "dspark_markov_bias_f16",
                    "dspark_markov_bias_bf16",
                ][..],
            ),
        ] {
            assert!(m.ptx.contains(".version"), "{} has no PTX header", m.name);
            for e in entries {
                assert!(
                    m.ptx.contains(&format!(".entry {e}(")),
                    "{} lacks {e}",
                    m.name
                );
            }
        }
    }

    #[test]
    fn grid_stride_bounds() {
        assert!(grid_stride(0, 256).is_none());
        let cfg = grid_stride(1, 256).map(|c| c.grid_dim.0);
        assert_eq!(cfg, Some(1));
        let cfg = grid_stride(usize::MAX, 1).map(|c| c.grid_dim.0);
        assert_eq!(cfg, Some(1 << 16));
    }
}
