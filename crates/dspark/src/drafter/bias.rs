//! [`ProposeOptions::logit_bias`](super::ProposeOptions): per-request amounts added to the
//! draft base logits at every slot, by target id mapped into the draft vocabulary, on the host
//! slice or (one `index_add`) on the device tensor.

use candle_core::Tensor;

use crate::error::Result;
use crate::idmap::IdMap;

/// The draft id of each target id (`u32::MAX`: none), built once per drafter (the id map's
/// own inverse lookup walks its table).
pub(crate) fn inverse(map: &IdMap) -> Vec<u32> {
    let mut out = vec![u32::MAX; map.target_vocab()];
    match map.table() {
        None => {
            for (t, d) in out.iter_mut().enumerate() {
                *d = t as u32;
            }
        }
        Some(table) => {
            for (d, &t) in table.iter().enumerate() {
                if let Some(slot) = out.get_mut(t as usize)
                    && *slot == u32::MAX
                {
                    *slot = d as u32;
                }
            }
        }
    }
    out
}

/// The draft id of target id `t` through the inverse `map`, if it is one of the `v` draft rows.
pub(crate) fn to_draft_id(map: &[u32], t: u32, v: usize) -> Option<usize> {
    map.get(t as usize).map(|&d| d as usize).filter(|&d| d < v)
}

/// The `(flat index, amount)` pairs of `bias` over base logits `[B, K, V_d]`.
fn entries(dims: [usize; 3], bias: &[Vec<(u32, f32)>], map: &[u32]) -> Vec<(usize, f32)> {
    let [b_n, k_n, v] = dims;
    let mut out = Vec::new();
    for (b, row) in bias.iter().enumerate().take(b_n) {
        for &(t, add) in row {
            let Some(d) = to_draft_id(map, t, v) else {
                continue;
            };
            for k in 0..k_n {
                out.push(((b * k_n + k) * v + d, add));
            }
        }
    }
    out
}

/// Add `bias` to the host base logits `base` (`[B, K, V_d]` row-major).
pub(crate) fn add_host(base: &mut [f32], dims: [usize; 3], bias: &[Vec<(u32, f32)>], map: &[u32]) {
    for (i, add) in entries(dims, bias, map) {
        if let Some(x) = base.get_mut(i) {
            *x += add;
        }
    }
}

/// `base` (`[B, K, V_d]`, on its device) with `bias` added.
pub(crate) fn add_tensor(base: &Tensor, bias: &[Vec<(u32, f32)>], map: &[u32]) -> Result<Tensor> {
    let (b, k, v) = base.dims3()?;
    let e = entries([b, k, v], bias, map);
    if e.is_empty() {
        return Ok(base.clone());
    }
    let index: Vec<u32> = e.iter().map(|&(i, _)| i as u32).collect();
    let amount: Vec<f32> = e.iter().map(|&(_, a)| a).collect();
    let n = index.len();
    let index = Tensor::from_vec(index, n, base.device())?;
    let amount = Tensor::from_vec(amount, n, base.device())?.to_dtype(base.dtype())?;
    Ok(base
        .flatten_all()?
        .index_add(&index, &amount, 0)?
        .reshape((b, k, v))?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn host_and_tensor_add_the_same_at_every_slot() {
        let map = inverse(&IdMap::identity(5).unwrap());
        let bias = vec![vec![(1, 2.0), (4, -1.0), (9, 5.0)], vec![]];
        let mut host = vec![0f32; 2 * 3 * 5];
        add_host(&mut host, [2, 3, 5], &bias, &map);
        for k in 0..3 {
            assert_eq!(host[k * 5 + 1], 2.0);
            assert_eq!(host[k * 5 + 4], -1.0);
        }
        assert_eq!(
            host.iter().filter(|&&x| x != 0.0).count(),
            6,
            "id 9 is outside"
        );
        let t = Tensor::zeros((2, 3, 5), candle_core::DType::F32, &Device::Cpu).unwrap();
        let got = add_tensor(&t, &bias, &map).unwrap();
        let got: Vec<f32> = got.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(got, host);
    }
}
