//! dspark's fused CUDA kernels run on the CPU: their source (`crates/dspark-kernels/kernels/*.cu`)
//! compiled as host C++ under a small emulator of the CUDA subset they use
//! (`kernels/emu/emu.h`: a block's threads as fibers, barriers and warp shuffles as
//! rendezvous), behind the same [`Backend`] the CUDA device implements. The tests run each
//! fused call here and through its Rust model, and compare the output words bit for bit: what
//! the GPU must then reproduce, checked without one.

use std::ffi::{CString, c_char, c_int, c_uint, c_void};
use std::sync::{Mutex, PoisonError};

use dspark::sampling::fused::{Backend, KernelParams, Launch};
use dspark::{Error, Result};

unsafe extern "C" {
    fn dspark_emu_launch(
        name: *const c_char,
        gx: c_uint,
        gy: c_uint,
        gz: c_uint,
        threads: c_uint,
        params: *const c_void,
    ) -> c_int;
}

/// Host memory as "device" memory: allocations are boxed byte buffers (8-byte aligned), their
/// addresses what the kernels receive.
#[derive(Default)]
pub struct Emu {
    /// Launches run, in order (their kernel names).
    pub launched: Vec<&'static str>,
    /// Uploads made.
    pub uploads: usize,
    /// Downloads made.
    pub downloads: usize,
}

/// An emulated device allocation.
pub struct Buffer(Vec<u64>);

impl Buffer {
    fn new(bytes: usize) -> Self {
        Buffer(vec![0u64; bytes.div_ceil(8).max(1)])
    }

    fn addr(&self) -> u64 {
        self.0.as_ptr() as u64
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the vector's memory, viewed as bytes.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast::<u8>(), self.0.len() * 8) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the vector's memory, viewed as bytes.
        unsafe {
            std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast::<u8>(), self.0.len() * 8)
        }
    }
}

impl Backend for Emu {
    type Buffer = Buffer;

    fn alloc(&mut self, bytes: usize) -> Result<(Buffer, u64)> {
        let b = Buffer::new(bytes);
        let a = b.addr();
        Ok((b, a))
    }

    fn upload(&mut self, data: &[u8]) -> Result<(Buffer, u64)> {
        self.uploads += 1;
        let mut b = Buffer::new(data.len());
        b.bytes_mut()[..data.len()].copy_from_slice(data);
        let a = b.addr();
        Ok((b, a))
    }

    fn launch<P: KernelParams>(&mut self, launch: &Launch, params: &P) -> Result<()> {
        self.launched.push(launch.kernel);
        let name = CString::new(launch.kernel).map_err(|e| Error::Internal {
            message: e.to_string(),
        })?;
        let (gx, gy, gz) = launch.grid;
        if gx == 0 || gy == 0 || gz == 0 {
            return Ok(());
        }
        // One emulated launch at a time in the process: the emulator's scheduler and the
        // kernels' `__shared__` arrays are process-wide statics.
        static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
        let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: `params` is the kernel's parameter block (`KernelParams`); every address in
        // it points at a live host allocation of this call.
        let rc = unsafe {
            dspark_emu_launch(
                name.as_ptr(),
                gx,
                gy,
                gz,
                launch.threads,
                (params as *const P).cast::<c_void>(),
            )
        };
        if rc != 0 {
            return Err(Error::Internal {
                message: format!("emulated launch of {} failed ({rc})", launch.kernel),
            });
        }
        Ok(())
    }

    fn download(&mut self, buf: &Buffer, offset: usize, bytes: usize) -> Result<Vec<u8>> {
        self.downloads += 1;
        Ok(buf.bytes()[offset..offset + bytes].to_vec())
    }
}
