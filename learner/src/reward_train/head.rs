//! How the scalar head starts. Its name and how it scores sequences are defined once, for the
//! trainer and the actors, in [`cascade_shared::reward_head`].

use candle_core::{DType, Device, Tensor};
use cascade_shared::reward_head::RewardHeadError;
pub use cascade_shared::reward_head::SCORE_WEIGHT;
use cascade_shared::rng;

use crate::error::Result;

/// How the scalar head starts.
#[derive(Debug, Clone)]
pub enum HeadInit {
    /// All zeros: every score starts at 0 (held-out accuracy exactly 0.5); the first step
    /// trains only the head, since the backbone gets no gradient through a zero head.
    Zeros,
    /// Seeded normal(0, `std`) draws (transformers uses `initializer_range`).
    Normal {
        /// Standard deviation.
        std: f64,
        /// Seed.
        seed: u64,
    },
    /// A given `(1, hidden)` tensor (e.g. to continue from a saved reward model).
    Tensor(Tensor),
}

/// The starting head, `(1, hidden)`, on `device` (f32, or the given tensor's dtype).
pub(super) fn initial_head(init: HeadInit, hidden: usize, device: &Device) -> Result<Tensor> {
    Ok(match init {
        HeadInit::Zeros => Tensor::zeros((1, hidden), DType::F32, device)?,
        HeadInit::Normal { std, seed } => {
            let mut r = rng::seeded(seed);
            let data: Vec<f32> = (0..hidden)
                .map(|_| {
                    // Box–Muller.
                    let u1 = rng::uniform(&mut r).max(f64::MIN_POSITIVE);
                    let u2 = rng::uniform(&mut r);
                    (std * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
                })
                .collect();
            Tensor::from_vec(data, (1, hidden), device)?
        }
        HeadInit::Tensor(t) => {
            if t.dims() != [1, hidden] {
                return Err(RewardHeadError::HeadShape {
                    hidden,
                    found: t.dims().to_vec(),
                }
                .into());
            }
            t.to_device(device)?
        }
    })
}
