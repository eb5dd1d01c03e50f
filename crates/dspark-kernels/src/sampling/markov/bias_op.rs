//! The per-slot Markov bias as a candle custom op: `out[b, d] = mult·(z[b, d] + W2[d]·e_b)`.
//!
//! `z` `[B, V_d]` f32 holds one slot's base logits, `W2` `[V_d, r]` (f32/f16/bf16) is the Markov
//! output matrix and `e` `[B, r]` f32 holds `W1[x_{k-1}]` of each request. [`MarkovBias`] is a
//! [`CustomOp3`]: its CPU body is the block sampler's own micro-kernel ([`bias_block`], the
//! oracle), run over column blocks in parallel; its CUDA body is `kernels/markov_bias.cu` (one
//! warp per output, f32 accumulation). [`markov_bias`] is the tensor front.

use crate::cpu::bias_block;
use crate::cpu::par::{map_range, worth_parallel};
use crate::error::{Error, Result};
use crate::view::{Floats, Mat};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, DType, Device, Layout, Shape, Tensor};

/// Draft ids per CPU work item (the same order of size as the block sampler's blocks).
const COLS: usize = 1024;

/// The Markov bias op; inputs `(z, w2, e)`, output `[B, V_d]` f32.
#[derive(Debug, Clone, Copy)]
pub struct MarkovBias {
    /// The factor applied after adding the bias (`logit_scale`, or 1).
    pub mult: f32,
}

/// `[B, V_d, r]` from the three layouts, or a shape error naming the offending input.
fn geometry(z: &Layout, w2: &Layout, e: &Layout) -> Result<[usize; 3]> {
    let two = |l: &Layout, name: &str, what: &str| {
        <[usize; 2]>::try_from(l.dims())
            .map_err(|_| Error::bad_shape(name, format!("shape {:?}, expected {what}", l.dims())))
    };
    let [b, v] = two(z, "base_logits", "[B, V_d]")?;
    let [v2, r] = two(w2, "markov_w2", "[V_d, r]")?;
    let [b2, r2] = two(e, "markov_e", "[B, r]")?;
    if v2 != v {
        return Err(Error::bad_shape(
            "markov_w2",
            format!("{v2} rows but the logits have {v} columns"),
        ));
    }
    if b2 != b || r2 != r {
        return Err(Error::bad_shape(
            "markov_e",
            format!("shape [{b2}, {r2}], expected [{b}, {r}]"),
        ));
    }
    Ok([b, v, r])
}

/// `(start, end)` of a contiguous layout, or an error naming the input.
fn span(l: &Layout, name: &str) -> candle_core::Result<(usize, usize)> {
    l.contiguous_offsets()
        .ok_or_else(|| candle_core::Error::msg(format!("markov_bias: {name} must be contiguous")))
}

fn f32_slice<'a>(s: &'a CpuStorage, name: &str) -> candle_core::Result<&'a [f32]> {
    match s {
        CpuStorage::F32(v) => Ok(v),
        other => Err(candle_core::Error::msg(format!(
            "markov_bias: {name} must be f32, got {:?}",
            other.dtype()
        ))),
    }
}

impl CustomOp3 for MarkovBias {
    fn name(&self) -> &'static str {
        "dspark-markov-bias"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let [b, v, r] = geometry(l1, l2, l3).map_err(candle_core::Error::wrap)?;
        let (z0, z1) = span(l1, "base_logits")?;
        let (w0, w1) = span(l2, "markov_w2")?;
        let (e0, e1) = span(l3, "markov_e")?;
        let z = &f32_slice(s1, "base_logits")?[z0..z1];
        let e = &f32_slice(s3, "markov_e")?[e0..e1];
        let w = match s2 {
            CpuStorage::F32(x) => Floats::F32(&x[w0..w1]),
            CpuStorage::F16(x) => Floats::F16(&x[w0..w1]),
            CpuStorage::BF16(x) => Floats::BF16(&x[w0..w1]),
            other => {
                return Err(candle_core::Error::msg(format!(
                    "markov_bias: markov_w2 must be f32, f16 or bf16, got {:?}",
                    other.dtype()
                )));
            }
        };
        let w2 = Mat::new(w, [v, r]).map_err(candle_core::Error::wrap)?;
        let out = bias_cpu(w2, z, e, b, v, self.mult);
        Ok((CpuStorage::F32(out), Shape::from_dims(&[b, v])))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let [b, v, r] = geometry(l1, l2, l3).map_err(candle_core::Error::wrap)?;
        let spans = [
            span(l1, "base_logits")?,
            span(l2, "markov_w2")?,
            span(l3, "markov_e")?,
        ];
        let out = cuda::bias(s1, s2, s3, spans, [b, v, r], self.mult)?;
        Ok((
            candle_core::CudaStorage::wrap_cuda_slice(out, s1.device.clone()),
            Shape::from_dims(&[b, v]),
        ))
    }
}

/// The CPU body: per block of [`COLS`] draft ids (in parallel when worth it), copy the base
/// logits of every request and run [`bias_block`] on them; then gather the blocks row-major.
fn bias_cpu(w2: Mat<'_>, z: &[f32], e: &[f32], b: usize, v: usize, mult: f32) -> Vec<f32> {
    let r = w2.dims[1];
    let nblk = v.div_ceil(COLS);
    let par = worth_parallel(b.saturating_mul(v).saturating_mul(r));
    let blocks: Vec<Vec<f32>> = map_range(par, nblk, |jb| {
        let d0 = jb * COLS;
        let len = COLS.min(v - d0);
        let mut buf = vec![0f32; b * len];
        for (i, seg) in buf.chunks_mut(len).enumerate() {
            seg.copy_from_slice(&z[i * v + d0..i * v + d0 + len]);
        }
        let mut dst: Vec<&mut [f32]> = buf.chunks_mut(len).collect();
        bias_block(w2, d0, e, &mut dst, mult);
        buf
    });
    let mut out = vec![0f32; b * v];
    for (jb, buf) in blocks.iter().enumerate() {
        let d0 = jb * COLS;
        let len = COLS.min(v - d0);
        for (i, seg) in buf.chunks(len).enumerate() {
            out[i * v + d0..i * v + d0 + len].copy_from_slice(seg);
        }
    }
    out
}

/// The CUDA body of [`MarkovBias`]: one launch of `kernels/markov_bias.cu`.
#[cfg(feature = "cuda")]
mod cuda {
    use crate::sampling::cuda_ptx::{BLOCK, MARKOV_BIAS, grid_stride};
    use candle_core::CudaStorage;
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{CudaSlice, PushKernelArg};
    use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};

    /// `out = mult·(z + W2·e)` on the device of `z`; `spans` are the contiguous `(start, end)`
    /// of `z`, `w2`, `e`, and `dims` is `[B, V_d, r]`.
    pub(super) fn bias(
        z: &CudaStorage,
        w2: &CudaStorage,
        e: &CudaStorage,
        spans: [(usize, usize); 3],
        dims: [usize; 3],
        mult: f32,
    ) -> candle_core::Result<CudaSlice<f32>> {
        let [b, v, r] = dims;
        let dev = &z.device;
        let zs = f32_of(z, "base_logits")?;
        let es = f32_of(e, "markov_e")?;
        let zv = zs.slice(spans[0].0..spans[0].1);
        let ev = es.slice(spans[2].0..spans[2].1);
        let outputs = b * v;
        // SAFETY: the kernel writes each of the `B·V_d` outputs before anyone reads them.
        let mut out = unsafe { dev.alloc::<f32>(outputs)? };
        // One warp (32 threads) per output: BLOCK / 32 outputs per block pass.
        let Some(cfg) = grid_stride(outputs, (BLOCK / 32) as usize) else {
            return Ok(out);
        };
        let stream = dev.cuda_stream();
        let (w0, w1) = spans[1];
        macro_rules! launch {
            ($w:expr, $name:literal) => {{
                let func = MARKOV_BIAS.func(dev, $name)?;
                let wv = $w.slice(w0..w1);
                let mut args = stream.launch_builder(&func);
                args.arg(&b)
                    .arg(&v)
                    .arg(&r)
                    .arg(&mult)
                    .arg(&zv)
                    .arg(&wv)
                    .arg(&ev)
                    .arg(&mut out);
                // SAFETY: the arguments match `(size_t batch, size_t vocab, size_t r,
                // float mult, const float *z, const W *w2, const float *e, float *out)`, with
                // `z`/`out` of `B·V_d`, `w2` of `V_d·r` and `e` of `B·r` elements.
                unsafe { args.launch(cfg) }.w()?;
            }};
        }
        match &w2.slice {
            CudaStorageSlice::F32(w) => launch!(w, "dspark_markov_bias_f32"),
            CudaStorageSlice::F16(w) => launch!(w, "dspark_markov_bias_f16"),
            CudaStorageSlice::BF16(w) => launch!(w, "dspark_markov_bias_bf16"),
            _ => {
                return Err(candle_core::Error::msg(format!(
                    "markov_bias: markov_w2 must be f32, f16 or bf16, got {:?}",
                    w2.dtype()
                )));
            }
        }
        Ok(out)
    }

    fn f32_of<'a>(s: &'a CudaStorage, name: &str) -> candle_core::Result<&'a CudaSlice<f32>> {
        match &s.slice {
            CudaStorageSlice::F32(x) => Ok(x),
            _ => Err(candle_core::Error::msg(format!(
                "markov_bias: {name} must be f32, got {:?}",
                s.dtype()
            ))),
        }
    }
}

/// `mult·(z + W2·e)` for `z` `[B, V_d]` (any float dtype; computed in f32), `w2` `[V_d, r]`
/// (f32/f16/bf16) and `e` `[B, r]`; returns `[B, V_d]` f32 on the device of `z`. CPU and CUDA
/// run in place; tensors on other devices are moved through the CPU and back.
pub fn markov_bias(z: &Tensor, w2: &Tensor, e: &Tensor, mult: f32) -> Result<Tensor> {
    let z = z.to_dtype(DType::F32)?.contiguous()?;
    let e = e
        .to_device(z.device())?
        .to_dtype(DType::F32)?
        .contiguous()?;
    let w2 = w2.to_device(z.device())?;
    let w2 = match w2.dtype() {
        DType::F32 | DType::F16 | DType::BF16 => w2.contiguous()?,
        _ => w2.to_dtype(DType::F32)?.contiguous()?,
    };
    geometry(z.layout(), w2.layout(), e.layout())?;
    let op = MarkovBias { mult };
    let dev = z.device();
    if dev.is_cpu() || dev.is_cuda() {
        Ok(z.apply_op3_no_bwd(&w2, &e, &op)?)
    } else {
        let cpu = |t: &Tensor| t.to_device(&Device::Cpu);
        let out = cpu(&z)?.apply_op3_no_bwd(&cpu(&w2)?, &cpu(&e)?, &op)?;
        Ok(out.to_device(dev)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    /// Deterministic values in `[-1, 1)`.
    fn vals(n: usize, seed: u32) -> Vec<f32> {
        crate::test_values::grid(n, seed, 2000, 1000.0, 1.0)
    }

    /// The twin, directly: one `bias_block` over all columns.
    fn twin(w2: Mat<'_>, z: &[f32], e: &[f32], v: usize, mult: f32) -> Vec<f32> {
        let mut out = z.to_vec();
        let mut dst: Vec<&mut [f32]> = out.chunks_mut(v).collect();
        bias_block(w2, 0, e, &mut dst, mult);
        out
    }

    fn check(b: usize, v: usize, r: usize, dtype: DType, mult: f32) -> Result<()> {
        let z = vals(b * v, 1);
        let w = vals(v * r, 2);
        let e = vals(b * r, 3);
        let wt = Tensor::from_vec(w.clone(), (v, r), &Device::Cpu)?.to_dtype(dtype)?;
        let zt = Tensor::from_vec(z.clone(), (b, v), &Device::Cpu)?;
        let et = Tensor::from_vec(e.clone(), (b, r), &Device::Cpu)?;
        let got = markov_bias(&zt, &wt, &et, mult)?;
        assert_eq!(got.dims(), &[b, v]);
        let got = got.flatten_all()?.to_vec1::<f32>()?;
        let want = match dtype {
            DType::F16 => {
                let h: Vec<f16> = w.iter().map(|&x| f16::from_f32(x)).collect();
                twin(Mat::new(Floats::F16(&h), [v, r])?, &z, &e, v, mult)
            }
            DType::BF16 => {
                let h: Vec<bf16> = w.iter().map(|&x| bf16::from_f32(x)).collect();
                twin(Mat::new(Floats::BF16(&h), [v, r])?, &z, &e, v, mult)
            }
            _ => twin(Mat::new(Floats::F32(&w), [v, r])?, &z, &e, v, mult),
        };
        // The op runs the twin itself, block by block: bit-identical.
        assert_eq!(
            got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        // And the twin is the formula (loose: summation order differs).
        for bi in 0..b {
            for d in 0..v {
                let dot: f32 = (0..r)
                    .map(|j| {
                        let wv = match dtype {
                            DType::F16 => f16::from_f32(w[d * r + j]).to_f32(),
                            DType::BF16 => bf16::from_f32(w[d * r + j]).to_f32(),
                            _ => w[d * r + j],
                        };
                        wv * e[bi * r + j]
                    })
                    .sum();
                let exact = mult * (z[bi * v + d] + dot);
                let g = got[bi * v + d];
                assert!(
                    (g - exact).abs() <= 1e-4 * (1.0 + exact.abs()),
                    "{g} vs {exact}"
                );
            }
        }
        Ok(())
    }

    #[test]
    fn cpu_matches_the_twin() -> Result<()> {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            check(3, 2500, 19, dtype, 1.0)?;
            check(1, 7, 64, dtype, 0.5)?;
        }
        check(5, 1024, 8, DType::F32, 2.0)?;
        Ok(())
    }

    /// On a machine with a GPU (the binary needs a driver to load at all): the PTX kernel
    /// against the CPU body, for every weight dtype and ragged `r`.
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_matches_cpu() -> Result<()> {
        let Ok(gpu) = Device::new_cuda(0) else {
            return Ok(());
        };
        for (b, v, r) in [(3, 2500, 19), (1, 7, 64), (8, 4099, 33)] {
            let z = Tensor::from_vec(vals(b * v, 1), (b, v), &Device::Cpu)?;
            let e = Tensor::from_vec(vals(b * r, 3), (b, r), &Device::Cpu)?;
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                let w = Tensor::from_vec(vals(v * r, 2), (v, r), &Device::Cpu)?.to_dtype(dtype)?;
                let want = markov_bias(&z, &w, &e, 0.75)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                let got = markov_bias(&z.to_device(&gpu)?, &w.to_device(&gpu)?, &e, 0.75)?;
                assert!(got.device().is_cuda());
                let got = got.flatten_all()?.to_vec1::<f32>()?;
                for (g, w) in got.iter().zip(&want) {
                    assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{g} vs {w}");
                }
            }
        }
        Ok(())
    }

    #[test]
    fn shape_errors_name_the_input() -> Result<()> {
        let z = Tensor::zeros((2, 10), DType::F32, &Device::Cpu)?;
        let w = Tensor::zeros((9, 4), DType::F32, &Device::Cpu)?;
        let e = Tensor::zeros((2, 4), DType::F32, &Device::Cpu)?;
        let err = markov_bias(&z, &w, &e, 1.0).err().map(|x| x.to_string());
        assert!(err.is_some_and(|m| m.contains("markov_w2")));
        let w = Tensor::zeros((10, 4), DType::F32, &Device::Cpu)?;
        let e = Tensor::zeros((3, 4), DType::F32, &Device::Cpu)?;
        let err = markov_bias(&z, &w, &e, 1.0).err().map(|x| x.to_string());
        assert!(err.is_some_and(|m| m.contains("markov_e")));
        Ok(())
    }
}
