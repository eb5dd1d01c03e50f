//! Arbitrary shapes, dtypes, values, ids and options into every kernel entry point (small
//! buffers; dimensions may be huge, then the data does not match them). Each call must give a
//! typed error or a result that satisfies the documented contract: never a panic, never a
//! token outside `[0, V_t)` (or `-1` padding for verify), never a probability outside [0, 1].
#![no_main]

use dspark::sampling::{BlockOptions, Floats, Mat, PerRequest, Rows3, Seeds, Tokens, VerifyOptions, confidence_slices, mask_padded_slice, sample_block_slices, verify_slices};
use dspark::policy::{StepsPerSecond, schedule_lengths, schedule_pipelined, threshold_lengths};
use dspark::{IdMap, VocabSizes};
use half::{bf16, f16};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;

/// A dimension: small, or now and then huge.
fn dim(u: &mut Unstructured<'_>) -> Result<usize> {
    Ok(match u.int_in_range(0u8..=15)? {
        0 => 1 << 33,
        1 => usize::MAX,
        2 => 1 << 31,
        _ => u.int_in_range(0usize..=6)?,
    })
}

fn small(d: usize) -> usize {
    if d > 64 { 0 } else { d }
}

/// An f32: arbitrary bits (NaN, ±inf, subnormals, huge) or an ordinary value.
fn value(u: &mut Unstructured<'_>) -> Result<f32> {
    Ok(if u.ratio(1u8, 4)? {
        f32::from_bits(u.arbitrary()?)
    } else {
        f32::from(u.int_in_range(-40i8..=40)?) / 8.0
    })
}

fn values(u: &mut Unstructured<'_>, n: usize) -> Result<Vec<f32>> {
    // Sometimes one element short or long.
    let n = match u.int_in_range(0u8..=15)? {
        0 => n.saturating_sub(1),
        1 => n + 1,
        _ => n,
    };
    (0..n).map(|_| value(u)).collect()
}

enum Held {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
}

impl Held {
    fn new(u: &mut Unstructured<'_>, v: Vec<f32>) -> Result<Self> {
        Ok(match u.int_in_range(0u8..=2)? {
            0 => Held::F32(v),
            1 => Held::F16(v.iter().map(|&x| f16::from_f32(x)).collect()),
            _ => Held::BF16(v.iter().map(|&x| bf16::from_f32(x)).collect()),
        })
    }

    fn floats(&self) -> Floats<'_> {
        match self {
            Held::F32(v) => Floats::F32(v),
            Held::F16(v) => Floats::F16(v),
            Held::BF16(v) => Floats::BF16(v),
        }
    }
}

fn id_map(u: &mut Unstructured<'_>, vd: usize) -> Result<Option<IdMap>> {
    Ok(if u.arbitrary()? {
        let vt = match u.int_in_range(0u8..=7)? {
            0 => 1 << 22,
            1 => 1 << 33,
            _ => u.int_in_range(0usize..=10)?,
        };
        IdMap::identity(vt).ok()
    } else {
        let offsets: Vec<i64> = (0..small(vd))
            .map(|_| u.int_in_range(-4i64..=8))
            .collect::<Result<_>>()?;
        let vt = u.int_in_range(0usize..=14)?;
        IdMap::from_offsets(&offsets, offsets.len(), vt).ok()
    })
}

fn sample_block(u: &mut Unstructured<'_>) -> Result<()> {
    let (b, k, vd) = (dim(u)?, dim(u)?, dim(u)?);
    let (vin, r) = (u.int_in_range(0usize..=8)?, u.int_in_range(0usize..=4)?);
    let base = values(u, small(b) * small(k) * small(vd))?;
    let base = Held::new(u, base)?;
    let w1 = values(u, vin * r)?;
    let w1 = Held::new(u, w1)?;
    let w2 = values(u, small(vd) * r)?;
    let w2 = Held::new(u, w2)?;
    let anchors: Vec<u32> = (0..small(b))
        .map(|_| u.int_in_range(0u32..=9))
        .collect::<Result<_>>()?;
    let Some(map) = id_map(u, vd)? else {
        return Ok(());
    };
    let opts = BlockOptions {
        temperature: value(u)?.abs(),
        seeds: if u.arbitrary()? {
            Seeds::Scalar(u.arbitrary()?)
        } else {
            Seeds::PerRequest((0..small(b) as u64).collect())
        },
        id_map: &map,
        top_k: if u.arbitrary()? {
            Some(u.int_in_range(0usize..=8)?)
        } else {
            None
        },
        logit_scale: if u.ratio(1u8, 4)? { value(u)? } else { 1.0 },
    };
    let out = sample_block_slices(
        Rows3 {
            data: base.floats(),
            dims: [b, k, vd],
        },
        Mat {
            data: w1.floats(),
            dims: [vin, r],
        },
        Mat {
            data: w2.floats(),
            dims: [vd, r],
        },
        &anchors,
        &opts,
    );
    if let Ok(block) = out {
        let vt = map.target_vocab();
        assert_eq!(block.tokens.len(), b * k);
        for (i, &t) in block.tokens.iter().enumerate() {
            assert!((t as usize) < vt, "token {t} outside [0, {vt})");
            assert!(block.draft_logits[i * vt + t as usize].is_finite());
        }
    }
    Ok(())
}

fn verify(u: &mut Unstructured<'_>) -> Result<()> {
    let (b, k1, v) = (dim(u)?, u.int_in_range(0usize..=4)?, dim(u)?);
    let k = k1.saturating_sub(1);
    let target = values(u, small(b) * k1 * small(v))?;
    let target = Held::new(u, target)?;
    let tdims = if u.ratio(1u8, 4)? { [k, b] } else { [b, k] };
    let drafts: Vec<i64> = (0..small(tdims[0]) * small(tdims[1]))
        .map(|_| u.int_in_range(-2i64..=9))
        .collect::<Result<_>>()?;
    let q = if u.arbitrary()? {
        Some(values(u, small(b) * k * small(v))?)
    } else {
        None
    };
    let per = |u: &mut Unstructured<'_>, x: f32| -> Result<PerRequest<f32>> {
        Ok(if u.arbitrary()? {
            PerRequest::All(x)
        } else {
            PerRequest::Each(vec![x; u.int_in_range(0usize..=4)?])
        })
    };
    let (t, p) = (value(u)?, value(u)?);
    let opts = VerifyOptions {
        temperature: per(u, t)?,
        top_k: PerRequest::All(if u.arbitrary()? {
            Some(u.int_in_range(0usize..=5)?)
        } else {
            None
        }),
        top_p: per(u, p)?,
        seeds: Seeds::Scalar(u.arbitrary()?),
        num_draft: if u.arbitrary()? {
            Some(
                (0..u.int_in_range(0usize..=4)?)
                    .map(|_| u.int_in_range(0usize..=5))
                    .collect::<Result<_>>()?,
            )
        } else {
            None
        },
        stop_token_ids: (0..u.int_in_range(0usize..=2)?)
            .map(|_| u.arbitrary())
            .collect::<Result<_>>()?,
    };
    let out = verify_slices(
        Rows3 {
            data: target.floats(),
            dims: [b, k1, v],
        },
        Tokens {
            data: &drafts,
            dims: tdims,
        },
        q.as_ref().map(|q| Rows3 {
            data: Floats::F32(q),
            dims: [b, k, v],
        }),
        &opts,
    );
    if let Ok(out) = out {
        assert_eq!(tdims, [b, k]);
        for r in 0..b {
            let row = &out.tokens[r * k1..(r + 1) * k1];
            let n = row.iter().position(|&t| t < 0).unwrap_or(k1);
            assert!(row[..n].iter().all(|&t| (t as usize) < v));
            assert!(row[n..].iter().all(|&t| t == -1));
            assert!(out.num_accepted[r] as usize <= k);
        }
    }
    Ok(())
}

fn confidence(u: &mut Unstructured<'_>) -> Result<()> {
    let (b, k, h) = (dim(u)?, dim(u)?, dim(u)?);
    let r = u.int_in_range(0usize..=3)?;
    let rows = small(b) * small(k);
    let hidden = values(u, rows * small(h))?;
    let hidden = Held::new(u, hidden)?;
    let prev = if u.arbitrary()? {
        Some(values(u, rows * r)?)
    } else {
        None
    };
    let weight = values(u, small(h) + r)?;
    let n = weight.len();
    let weight = Held::new(u, weight)?;
    let shape = match u.int_in_range(0u8..=3)? {
        0 => vec![n],
        1 => vec![1, n],
        2 => vec![n, 1],
        _ => vec![],
    };
    let out = confidence_slices(
        Rows3 {
            data: hidden.floats(),
            dims: [b, k, h],
        },
        prev.as_deref(),
        weight.floats(),
        &shape,
        value(u)?,
        None,
    );
    if let Ok(c) = out {
        assert!(shape == [n] || shape == [1, n]);
        assert_eq!(c.len(), b * k);
        assert!(c.iter().all(|x| (0.0..=1.0).contains(x)));
    }
    Ok(())
}

fn schedules(u: &mut Unstructured<'_>) -> Result<()> {
    let (b, k) = (dim(u)?, dim(u)?);
    let c = values(u, small(b) * small(k))?;
    let threshold = value(u)?;
    if let Ok(l) = threshold_lengths(&c, b, k, threshold) {
        assert!(l.len() == b && l.iter().all(|&x| x <= k));
    }
    let points: Vec<(usize, f64)> = (0..u.int_in_range(0usize..=3)?)
        .map(|_| Ok((u.int_in_range(0usize..=9)?, f64::from(value(u)?))))
        .collect::<Result<_>>()?;
    if let Ok(sps) = StepsPerSecond::linear(points) {
        if let Ok(l) = schedule_lengths(&c, b, k, &sps) {
            assert!(l.len() == b && l.iter().all(|&x| x <= k));
        }
        if let Ok(l) = schedule_pipelined(&c, &c, b, k, &sps) {
            assert!(l.len() == b && l.iter().all(|&x| x <= k));
        }
    }
    Ok(())
}

fn vocab(u: &mut Unstructured<'_>) -> Result<()> {
    let (vi, vd, vt) = (dim(u)?, dim(u)?, dim(u)?);
    let _ = VocabSizes::try_new(vi, vd, vt);
    if let Ok(m) = IdMap::identity(vt) {
        let id = dim(u)?;
        if let Some(t) = m.to_target(id) {
            assert!(t as usize == id && id < vt);
        }
    }
    let mut data = values(u, small(vi))?;
    let _ = mask_padded_slice(&mut data, vd, vt);
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let _ = match u.int_in_range(0u8..=4) {
        Ok(0) => sample_block(&mut u),
        Ok(1) => verify(&mut u),
        Ok(2) => confidence(&mut u),
        Ok(3) => schedules(&mut u),
        _ => vocab(&mut u),
    };
});
