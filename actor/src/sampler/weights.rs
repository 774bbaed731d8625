//! The numerics that the CPU sampler and the CUDA kernel share bit for bit.
//!
//! Every draw is decided in integers: each token's weight `exp(z - max)` (with `z = logit / T`)
//! is computed by [`exp_neg`], a Cephes-style `expf` written with plain IEEE multiplies and adds
//! (no FMA: the kernel is compiled with `--fmad=false`), and quantised by [`quantize`] to a
//! 64-bit fixed-point integer. Top-k/top-p thresholds and the inverse-CDF draw then use exact
//! integer sums, which do not depend on summation order: the GPU's parallel reductions give the
//! same thresholds and the same token as the CPU's sequential loops, and a draw is reproducible
//! bit for bit. The cost is that a token whose probability relative to the most likely one is
//! below `2^-42` (about `2e-13`) has weight 0 and is never drawn; over a 151 936-token vocabulary
//! that is at most `3.5e-8` of the probability mass. The behaviour log-prob does not use the
//! quantised weights; it is computed in floating point over the whole vocabulary.

/// Largest vocabulary: `MAX_VOCAB * 2^42` must fit a `u64` sum of weights.
pub const MAX_VOCAB: usize = 1 << 22;

/// `log2(e)` as f32 (bits `0x3fb8aa3b`).
const LOG2E: f32 = f32::from_bits(0x3fb8_aa3b);
/// `1.5 * 2^23`: adding it rounds a float of magnitude below `2^22` to the nearest integer.
const MAGIC: f32 = f32::from_bits(0x4b40_0000);
/// `ln 2` split in a high part with few mantissa bits (exact products) ...
const LN2_HI: f32 = f32::from_bits(0x3f31_8000);
/// ... and the low remainder (Cody-Waite reduction).
const LN2_LO: f32 = f32::from_bits(0xb95e_8083);
/// Cephes `expf` minimax polynomial coefficients, highest degree first.
const POLY: [f32; 6] = [
    f32::from_bits(0x3950_6967),
    f32::from_bits(0x3ab7_43ce),
    f32::from_bits(0x3c08_8908),
    f32::from_bits(0x3d2a_a9c1),
    f32::from_bits(0x3e2a_aaaa),
    f32::from_bits(0x3f00_0000),
];
/// Arguments below this are clamped, so `2^n` stays a normal float.
const EXP_CLAMP: f32 = -87.0;
/// Fixed-point scale of the integer weights: `2^42`.
const WEIGHT_SCALE: f32 = f32::from_bits(0x5480_0000);

/// `exp(d)` for `d <= 0`, to about 2 ulp; `d < -87` (and `-inf`) gives `exp(-87)`, which
/// quantises to 0. The kernel's `exp_neg` performs the same operations in the same order.
#[inline(always)]
pub fn exp_neg(d: f32) -> f32 {
    // `d.max(EXP_CLAMP)` for every input, NaN included (both give the clamp), in the form
    // that compiles to one `maxps`.
    let x = if d > EXP_CLAMP { d } else { EXP_CLAMP };
    let t = x * LOG2E + MAGIC;
    let n = t - MAGIC; // round-to-nearest(x * log2 e), exactly
    let n_int = (t.to_bits() as i32) - 0x4b40_0000;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = POLY[0];
    p = p * r + POLY[1];
    p = p * r + POLY[2];
    p = p * r + POLY[3];
    p = p * r + POLY[4];
    p = p * r + POLY[5];
    let y = p * (r * r) + r + 1.0;
    y * f32::from_bits(((n_int + 127) as u32) << 23)
}

/// The integer weight of a token with `w = exp(z - max)` in `(0, 1]`: `trunc(w * 2^42)`.
#[inline(always)]
pub fn quantize(w: f32) -> u64 {
    // w * 2^42 < 2^63, so the signed conversion (one instruction on x86-64, unlike f32 -> u64)
    // truncates exactly like the kernel's f32 -> unsigned long long.
    (w * WEIGHT_SCALE) as i64 as u64
}

/// Total order on logits as unsigned integers: larger logit, larger key. `-0.0` counts as `+0.0`
/// so that it ties with it; `-inf` has the smallest key of all non-NaN values.
#[inline(always)]
pub fn order_key(logit: f32) -> u32 {
    let bits = (logit + 0.0).to_bits();
    if bits & 0x8000_0000 != 0 {
        !bits
    } else {
        bits | 0x8000_0000
    }
}

/// `floor(bits / 2^32 * total)`: the inverse-CDF target in `[0, total)` for uniform bits.
#[inline(always)]
pub fn scale_uniform(bits: u32, total: u64) -> u64 {
    ((u128::from(bits) * u128::from(total)) >> 32) as u64
}

/// The top-p mass target `ceil(p * total)`, clamped to `[1, total]`, computed in f64 as the
/// kernel does.
#[inline]
pub fn top_p_target(p: f32, total: u64) -> u64 {
    let t = (f64::from(p) * total as f64).ceil() as u64;
    t.clamp(1, total.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_neg_is_accurate() {
        let mut worst = 0.0f64;
        let mut d = 0.0f32;
        while d > -87.0 {
            let got = f64::from(exp_neg(d));
            let want = f64::from(d).exp();
            worst = worst.max(((got - want) / want).abs());
            d -= 0.001_37;
        }
        assert!(worst < 3e-7, "relative error {worst}");
        assert_eq!(exp_neg(0.0), 1.0);
        assert_eq!(quantize(exp_neg(f32::NEG_INFINITY)), 0);
        assert_eq!(quantize(exp_neg(-87.0)), 0);
    }

    #[test]
    fn order_key_is_monotone() {
        let vals = [
            f32::NEG_INFINITY,
            -3.5,
            -1e-30,
            -0.0,
            0.0,
            1e-30,
            2.0,
            7.25,
            f32::INFINITY,
        ];
        for w in vals.windows(2) {
            assert!(order_key(w[0]) <= order_key(w[1]), "{} vs {}", w[0], w[1]);
        }
        assert_eq!(order_key(-0.0), order_key(0.0));
        assert!(order_key(-3.5) < order_key(-1e-30));
    }

    #[test]
    fn integer_helpers() {
        assert_eq!(quantize(1.0), 1 << 42);
        assert_eq!(scale_uniform(0, 1000), 0);
        assert_eq!(scale_uniform(u32::MAX, 1000), 999);
        assert_eq!(scale_uniform(1 << 31, 1000), 500);
        assert_eq!(top_p_target(0.5, 11), 6);
        assert_eq!(top_p_target(1.0, 11), 11);
        assert_eq!(top_p_target(1e-9, 11), 1);
    }
}
