//! Philox4x32-10, the counter-based RNG of Salmon et al., "Parallel random numbers: as easy as
//! 1, 2, 3" (SC'11), bit-exact with Random123's `philox4x32` and cuRAND's Philox generator.
//!
//! A draw is a pure function of (counter, key), so a sample's randomness does not depend on the
//! batch layout, the thread that runs it, or the device. The CUDA kernel
//! (`kernels/sampler.cu`) carries the same function; both are checked against Random123's
//! known-answer vectors.

use super::params::SampleKey;

/// First round multiplier.
const M0: u32 = 0xD251_1F53;
/// Second round multiplier.
const M1: u32 = 0xCD9E_8D57;
/// Weyl increment of key word 0 (golden ratio).
const W0: u32 = 0x9E37_79B9;
/// Weyl increment of key word 1 (sqrt(3) - 1).
const W1: u32 = 0xBB67_AE85;

/// Number of rounds: 10 is the Random123 default and what cuRAND uses.
pub const ROUNDS: usize = 10;

#[inline(always)]
fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = u64::from(a) * u64::from(b);
    ((p >> 32) as u32, p as u32)
}

#[inline(always)]
fn round(ctr: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (hi0, lo0) = mulhilo(M0, ctr[0]);
    let (hi1, lo1) = mulhilo(M1, ctr[2]);
    [hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0]
}

/// Philox4x32 with `ROUNDS` rounds: four 32-bit outputs for one 128-bit counter and 64-bit key.
#[inline]
pub fn philox4x32_10(mut ctr: [u32; 4], mut key: [u32; 2]) -> [u32; 4] {
    ctr = round(ctr, key);
    for _ in 1..ROUNDS {
        key[0] = key[0].wrapping_add(W0);
        key[1] = key[1].wrapping_add(W1);
        ctr = round(ctr, key);
    }
    ctr
}

/// The Philox counter and key of a sample key: counter = (position lo, position hi, stream lo,
/// stream hi), key = (seed lo, seed hi). The kernel builds them the same way.
#[inline]
pub fn counter_and_key(key: &SampleKey) -> ([u32; 4], [u32; 2]) {
    (
        [
            key.position as u32,
            (key.position >> 32) as u32,
            key.stream as u32,
            (key.stream >> 32) as u32,
        ],
        [key.seed as u32, (key.seed >> 32) as u32],
    )
}

/// The 32 uniform bits used for a draw: word 0 of Philox4x32-10 at the key's counter.
///
/// The draw's uniform is `bits / 2^32` in `[0, 1)`; samplers apply it in integer arithmetic
/// (see [`super::weights::scale_uniform`]) so the CPU and the GPU pick the same token.
#[inline]
pub fn uniform_bits(key: &SampleKey) -> u32 {
    let (ctr, k) = counter_and_key(key);
    philox4x32_10(ctr, k)[0]
}

/// The uniform in `[0, 1)` for `bits`, with 24 bits of resolution (exactly representable).
#[inline]
pub fn uniform_f32(bits: u32) -> f32 {
    (bits >> 8) as f32 * (1.0 / 16_777_216.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random123 `kat_vectors`, lines `philox4x32 10 ...`.
    #[test]
    fn random123_known_answers() {
        let cases: [([u32; 4], [u32; 2], [u32; 4]); 3] = [
            (
                [0; 4],
                [0; 2],
                [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8],
            ),
            (
                [u32::MAX; 4],
                [u32::MAX; 2],
                [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd],
            ),
            (
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0],
                [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1],
            ),
        ];
        for (ctr, key, want) in cases {
            assert_eq!(
                philox4x32_10(ctr, key),
                want,
                "ctr {ctr:08x?} key {key:08x?}"
            );
        }
    }

    #[test]
    fn key_layout_splits_words() {
        let k = SampleKey {
            seed: 0x0102_0304_0506_0708,
            stream: 0x1112_1314_1516_1718,
            position: 0x2122_2324_2526_2728,
        };
        let (ctr, key) = counter_and_key(&k);
        assert_eq!(ctr, [0x2526_2728, 0x2122_2324, 0x1516_1718, 0x1112_1314]);
        assert_eq!(key, [0x0506_0708, 0x0102_0304]);
    }

    #[test]
    fn uniform_is_in_unit_interval() {
        assert_eq!(uniform_f32(0), 0.0);
        assert!(uniform_f32(u32::MAX) < 1.0);
    }
}
