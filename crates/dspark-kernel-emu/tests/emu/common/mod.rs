//! What the emulator tests share: a small deterministic RNG and values in one of the three
//! dtypes, with the address the emulated device reads them at.

#![allow(dead_code)]

use dspark::sampling::Floats;
use dspark::sampling::fused::layout::Dtype;
use half::{bf16, f16};

/// SplitMix64.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }

    pub fn values(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| (self.uniform() - 0.5) * scale).collect()
    }
}

/// Values in one dtype (`0` f32, `1` f16, else bf16).
pub enum Data {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
}

impl Data {
    pub fn new(v: Vec<f32>, dtype: usize) -> Self {
        match dtype {
            0 => Data::F32(v),
            1 => Data::F16(v.iter().map(|&x| f16::from_f32(x)).collect()),
            _ => Data::BF16(v.iter().map(|&x| bf16::from_f32(x)).collect()),
        }
    }

    pub fn floats(&self) -> Floats<'_> {
        match self {
            Data::F32(v) => Floats::F32(v),
            Data::F16(v) => Floats::F16(v),
            Data::BF16(v) => Floats::BF16(v),
        }
    }

    /// The address the emulated device reads them at, and their dtype.
    pub fn device(&self) -> (u64, Dtype) {
        match self {
            Data::F32(v) => (v.as_ptr() as u64, Dtype::F32),
            Data::F16(v) => (v.as_ptr() as u64, Dtype::F16),
            Data::BF16(v) => (v.as_ptr() as u64, Dtype::BF16),
        }
    }
}
