//! Row values held owned in one of the three float dtypes, so [`Floats`] views can borrow them.

use dspark::sampling::Floats;
use half::{bf16, f16};

/// Values in one dtype, owned.
#[derive(Debug, Clone)]
pub enum Held {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
}

impl Held {
    /// `v` in dtype `dtype mod 3`: 0 is f32, 1 is f16, 2 is bf16.
    pub fn new(v: Vec<f32>, dtype: usize) -> Self {
        match dtype % 3 {
            0 => Held::F32(v),
            1 => Held::F16(v.iter().map(|&x| f16::from_f32(x)).collect()),
            _ => Held::BF16(v.iter().map(|&x| bf16::from_f32(x)).collect()),
        }
    }

    /// A view of the values.
    pub fn floats(&self) -> Floats<'_> {
        match self {
            Held::F32(v) => Floats::F32(v),
            Held::F16(v) => Floats::F16(v),
            Held::BF16(v) => Floats::BF16(v),
        }
    }
}
