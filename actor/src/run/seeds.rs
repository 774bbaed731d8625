//! The actor's seeded draws: the think/no-think mode of a prompt and the seed mixing that the
//! prompt schedule and the generation seeds use. Each draw has its own Philox stream (a salt),
//! apart from the sampler's.

use cascade_shared::Mode;

use crate::sampler::philox::{uniform_bits, uniform_f32};
use crate::sampler::SampleKey;

/// Salt of the per-prompt think/no-think draw (a Philox stream apart from the sampler's).
const MODE_SALT: u64 = 0x6d6f_6465_5f6d_6978;
/// Salt of the per-epoch prompt order.
pub(super) const ORDER_SALT: u64 = 0x6f72_6465_725f_7368;

/// Mixes two words into one (splitmix64 finaliser over `a ^ b·φ`).
pub(super) fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Think or no-think for a prompt: a seeded draw, `Think` with probability `mode_mix`.
pub fn choose_mode(seed: u64, prompt_id: u64, epoch: u64, mode_mix: f64) -> Mode {
    let u = uniform_f32(uniform_bits(&SampleKey {
        seed: seed ^ MODE_SALT,
        stream: prompt_id,
        position: epoch,
    }));
    if f64::from(u) < mode_mix {
        Mode::Think
    } else {
        Mode::NoThink
    }
}
