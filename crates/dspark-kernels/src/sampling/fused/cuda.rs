//! The CUDA backend of the fused kernels: the fatbins `build.rs` compiles from
//! `kernels/fused_*.cu` (SASS for sm_90, PTX for compute_90), loaded once per context through
//! cudarc, launched on candle's stream with their parameter block by value, scratch from the
//! stream-ordered allocator, results through pinned host memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use candle_core::cuda_backend::cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    LaunchConfig, PinnedHostSlice, PushKernelArg, result,
};
use candle_core::cuda_backend::cudarc::nvrtc::Ptx;
use candle_core::{CudaDevice, Device};

use super::exec::{Backend, KernelParams};
use super::plan::Launch;
use crate::error::{Error, Result};

/// `kernels/fused_verify.cu` built for sm_90 (SASS) and compute_90 (PTX).
static VERIFY_FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fused_verify.fatbin"));
/// `kernels/fused_block.cu`, likewise.
static BLOCK_FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fused_block.fatbin"));

/// Which fused module a kernel lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Module {
    /// `fused_verify.cu`.
    Verify,
    /// `fused_block.cu`.
    Block,
}

impl Module {
    fn image(self) -> &'static [u8] {
        match self {
            Module::Verify => VERIFY_FATBIN,
            Module::Block => BLOCK_FATBIN,
        }
    }

    fn of(kernel: &str) -> Self {
        if kernel.starts_with("dspark_vf_") {
            Module::Verify
        } else {
            Module::Block
        }
    }
}

fn driver(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Candle(candle_core::Error::Cuda(format!("{what}: {e}").into()))
}

/// The loaded modules of each context (by `CUcontext` address).
fn module(ctx: &Arc<CudaContext>, which: Module) -> Result<Arc<CudaModule>> {
    type Cache = HashMap<(usize, Module), Arc<CudaModule>>;
    static MODULES: Mutex<Option<Cache>> = Mutex::new(None);
    let key = (ctx.cu_ctx() as usize, which);
    let mut guard = MODULES
        .lock()
        .map_err(|_| Error::invalid("device", "the fused-kernel cache was poisoned by a panic"))?;
    let map = guard.get_or_insert_with(HashMap::new);
    if let Some(m) = map.get(&key) {
        return Ok(m.clone());
    }
    let loaded = ctx
        .load_module(Ptx::from_binary(which.image().to_vec()))
        .map_err(|e| {
            let cc = ctx
                .compute_capability()
                .map_or_else(|_| "unknown".to_string(), |(a, b)| format!("sm_{a}{b}"));
            let name = ctx.name().unwrap_or_else(|_| "this GPU".into());
            Error::DeviceUnavailable {
                name: "device".into(),
                device: format!("cuda:{}", ctx.ordinal()),
                message: format!(
                    "{name} ({cc}) cannot load dspark's fused kernels, built for sm_90 (SASS) \
                     and compute_90 (PTX 9.0): the driver says {e}; a GPU of compute capability \
                     9.0 or newer and a driver for CUDA 13.0 or newer are needed"
                ),
            }
        })?;
    map.insert(key, loaded.clone());
    Ok(loaded)
}

/// The address and element type of a contiguous CUDA float tensor.
pub(crate) fn input(t: &candle_core::Tensor, name: &str) -> Result<(u64, super::layout::Dtype)> {
    use super::layout::Dtype;
    let dtype = match t.dtype() {
        candle_core::DType::F32 => Dtype::F32,
        candle_core::DType::F16 => Dtype::F16,
        candle_core::DType::BF16 => Dtype::BF16,
        other => {
            return Err(Error::UnsupportedDtype {
                name: name.into(),
                message: format!("{other:?} (need f32, f16 or bf16)"),
            });
        }
    };
    Ok((crate::cuda_interop::device_ptr(t)?, dtype))
}

/// An f32 tensor of `shape` on CUDA device `dev`, its memory uninitialized (the kernels write
/// every value before anyone reads it).
pub(crate) fn uninit_f32(dev: &Device, shape: &[usize]) -> Result<candle_core::Tensor> {
    let cuda = dev.as_cuda_device()?;
    let n: usize = shape.iter().product();
    if n == 0 {
        return Ok(candle_core::Tensor::zeros(
            shape,
            candle_core::DType::F32,
            dev,
        )?);
    }
    // SAFETY: every element is written by the fused launches of the call that asked for it.
    let slice = unsafe { cuda.alloc::<f32>(n) }?;
    let storage = candle_core::CudaStorage::wrap_cuda_slice(slice, cuda.clone());
    Ok(candle_core::Tensor::from_storage(
        candle_core::Storage::Cuda(storage),
        shape,
        candle_core::op::BackpropOp::none(),
        false,
    ))
}

/// A parameter block by value, as cudarc pushes kernel arguments.
#[derive(Clone, Copy)]
#[repr(transparent)]
struct ByValue<P>(P);

// SAFETY: `P` is `#[repr(C)]` plain data the kernel declares field for field (`KernelParams`).
unsafe impl<P: KernelParams> DeviceRepr for ByValue<P> {}

/// The fused kernels on one CUDA device's stream.
pub(crate) struct CudaBackend {
    stream: Arc<CudaStream>,
    functions: HashMap<&'static str, CudaFunction>,
}

impl CudaBackend {
    /// The backend of a candle CUDA device.
    pub(crate) fn new(device: &Device) -> Result<Self> {
        let cuda: &CudaDevice = device.as_cuda_device()?;
        Ok(CudaBackend {
            stream: cuda.cuda_stream(),
            functions: HashMap::new(),
        })
    }

    /// Load both fused modules on this device's context.
    pub(crate) fn load_all(&mut self) -> Result<()> {
        module(self.stream.context(), Module::Verify)?;
        module(self.stream.context(), Module::Block)?;
        Ok(())
    }

    fn function(&mut self, kernel: &'static str) -> Result<CudaFunction> {
        if let Some(f) = self.functions.get(kernel) {
            return Ok(f.clone());
        }
        let m = module(self.stream.context(), Module::of(kernel))?;
        let f = m
            .load_function(kernel)
            .map_err(|e| driver(&format!("loading {kernel}"), e))?;
        self.functions.insert(kernel, f.clone());
        Ok(f)
    }

    fn address(&self, s: &CudaSlice<u8>) -> u64 {
        let (ptr, _sync) = s.device_ptr(&self.stream);
        ptr
    }
}

/// Pinned host buffers for results, reused across calls (allocating pinned memory costs far
/// more than a call).
fn take_pinned(ctx: &Arc<CudaContext>, bytes: usize) -> Result<PinnedHostSlice<u8>> {
    if let Ok(mut pool) = pinned_pool().lock()
        && let Some(i) = pool
            .iter()
            .position(|(c, p)| *c == ctx.cu_ctx() as usize && p.len() >= bytes)
    {
        return Ok(pool.swap_remove(i).1);
    }
    // SAFETY: the buffer is only read after a copy into it has completed.
    unsafe { ctx.alloc_pinned_with_flags::<u8>(bytes.max(4096), 0) }
        .map_err(|e| driver("allocating pinned host memory", e))
}

type PinnedPool = Mutex<Vec<(usize, PinnedHostSlice<u8>)>>;

fn pinned_pool() -> &'static PinnedPool {
    static POOL: PinnedPool = Mutex::new(Vec::new());
    &POOL
}

fn give_pinned(ctx: &Arc<CudaContext>, p: PinnedHostSlice<u8>) {
    if let Ok(mut pool) = pinned_pool().lock()
        && pool.len() < 16
    {
        pool.push((ctx.cu_ctx() as usize, p));
    }
}

impl Backend for CudaBackend {
    type Buffer = CudaSlice<u8>;

    fn alloc(&mut self, bytes: usize) -> Result<(CudaSlice<u8>, u64)> {
        // SAFETY: every byte a kernel reads was written by an earlier launch of the same call.
        let s = unsafe { self.stream.alloc::<u8>(bytes.max(1)) }
            .map_err(|e| driver("allocating fused scratch", e))?;
        let a = self.address(&s);
        Ok((s, a))
    }

    fn upload(&mut self, data: &[u8]) -> Result<(CudaSlice<u8>, u64)> {
        let s = self
            .stream
            .clone_htod(data)
            .map_err(|e| driver("uploading fused inputs", e))?;
        let a = self.address(&s);
        Ok((s, a))
    }

    fn launch<P: KernelParams>(&mut self, launch: &Launch, params: &P) -> Result<()> {
        let f = self.function(launch.kernel)?;
        let cfg = LaunchConfig {
            grid_dim: launch.grid,
            block_dim: (launch.threads, 1, 1),
            shared_mem_bytes: 0,
        };
        if cfg.grid_dim.0 == 0 || cfg.grid_dim.1 == 0 || cfg.grid_dim.2 == 0 {
            return Ok(());
        }
        let value = ByValue(*params);
        let mut args = self.stream.launch_builder(&f);
        args.arg(&value);
        // SAFETY: every fused kernel takes exactly one argument, its parameter block by value,
        // whose addresses point at live allocations of this call (kept until its download).
        unsafe { args.launch(cfg) }
            .map_err(|e| driver(&format!("launching {}", launch.kernel), e))?;
        Ok(())
    }

    fn download(&mut self, buf: &CudaSlice<u8>, offset: usize, bytes: usize) -> Result<Vec<u8>> {
        if offset + bytes > buf.len() {
            return Err(Error::Internal {
                message: format!(
                    "fused download of {bytes} bytes at {offset} from {}",
                    buf.len()
                ),
            });
        }
        let ctx = self.stream.context().clone();
        let mut pinned = take_pinned(&ctx, bytes)?;
        let ptr = pinned
            .as_mut_ptr()
            .map_err(|e| driver("waiting for a pinned buffer", e))?;
        // SAFETY: the pinned buffer holds at least `bytes` bytes and no copy into it is pending
        // (`as_mut_ptr` waited for its last use).
        let host = unsafe { std::slice::from_raw_parts_mut(ptr, bytes) };
        let src = self.address(buf) + offset as u64;
        ctx.bind_to_thread()
            .map_err(|e| driver("binding the CUDA context", e))?;
        // SAFETY: `src` is `bytes` bytes inside `buf`, a live allocation of this context;
        // the host range is pinned memory of the same size.
        unsafe { result::memcpy_dtoh_async(host, src, self.stream.cu_stream()) }
            .map_err(|e| driver("copying fused results", e))?;
        self.stream
            .synchronize()
            .map_err(|e| driver("waiting for fused results", e))?;
        let out = host.to_vec();
        give_pinned(&ctx, pinned);
        Ok(out)
    }
}
