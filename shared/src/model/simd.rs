//! Vectorisable f32 primitives for the CPU kernels (the fused attention, the LM head's
//! log-softmax), written as scalar code that LLVM vectorises once a kernel is compiled with
//! AVX2 and FMA ([`Isa::Avx2Fma`], chosen at run time by [`detect_isa`]).

/// Whether this CPU runs the AVX2 + FMA build of the kernels.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Isa {
    #[cfg(target_arch = "x86_64")]
    Avx2Fma,
    Generic,
}

/// The best [`Isa`] this CPU supports.
pub(crate) fn detect_isa() -> Isa {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        return Isa::Avx2Fma;
    }
    Isa::Generic
}

/// `a · b + c`: `mul_add` when `FMA` (only fast, and only used, in code compiled with the `fma`
/// target feature), else a multiply and an add.
#[inline(always)]
pub(crate) fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// 1.5 · 2²³: adding it to a float of magnitude below 2²² leaves the float's integer part in
/// the low mantissa bits.
const MAGIC_ROUND: f32 = 12_582_912.0;

/// `exp(x)` as a polynomial (Cephes `expf`: range reduction by ln 2, degree-6 minimax), within
/// 2 ulp of `f32::exp` on `[-87, 88]`; vectorises where the libm call does not. Inputs below
/// -87.3 return ~1e-38 instead of 0 (only differences `s - max <= 0` are passed).
#[inline(always)]
pub(crate) fn fast_exp<const FMA: bool>(x: f32) -> f32 {
    let x = x.clamp(-87.336_54, 88.722_83);
    let n = (x * std::f32::consts::LOG2_E + 0.5).floor();
    let r = madd::<FMA>(n, -0.693_359_4, x);
    let r = madd::<FMA>(n, 2.121_944_4e-4, r);
    let mut p = 1.987_569_1e-4f32;
    p = madd::<FMA>(p, r, 1.398_199_9e-3);
    p = madd::<FMA>(p, r, 8.333_452e-3);
    p = madd::<FMA>(p, r, 4.166_579_6e-2);
    p = madd::<FMA>(p, r, 1.666_666_5e-1);
    p = madd::<FMA>(p, r, 0.5);
    let y = madd::<FMA>(p, r * r, r) + 1.0;
    // 2^n by building the exponent bits; n is in [-126, 128] after the clamp. The integer n
    // is read from the bits of n + 1.5 · 2²³ (exact for |n| < 2²²) rather than by `as i32`,
    // whose saturating conversion LLVM does not vectorise (it was one scalar `cvttss2si` per
    // element); the same value for every finite input.
    let n_int = ((n + MAGIC_ROUND).to_bits() as i32).wrapping_sub(MAGIC_ROUND.to_bits() as i32);
    let two_n = f32::from_bits(((n_int + 127).clamp(1, 254) as u32) << 23);
    y * two_n
}

/// Lanes of the row reductions: a fixed count, so that a row's max and sum are the same bits
/// on every CPU and with every thread count.
pub(crate) const LANES: usize = 16;

/// The maximum of `row` (`-inf` when empty), over [`LANES`] lanes.
#[inline(always)]
pub(crate) fn row_max(row: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &v) in m.iter_mut().zip(c) {
            *m = if v > *m { v } else { *m };
        }
    }
    let mut out = m.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for &v in tail {
        out = out.max(v);
    }
    out
}

/// `Σ exp(row_j − shift)`, over [`LANES`] lanes summed in lane order.
#[inline(always)]
pub(crate) fn sum_exp<const FMA: bool>(row: &[f32], shift: f32) -> f32 {
    let mut s = [0f32; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail: f32 = chunks
        .remainder()
        .iter()
        .map(|&v| fast_exp::<FMA>(v - shift))
        .sum();
    for c in chunks {
        for (s, &v) in s.iter_mut().zip(c) {
            *s += fast_exp::<FMA>(v - shift);
        }
    }
    s.iter().sum::<f32>() + tail
}

/// [`sum_exp`], replacing each `row_j` by `exp(row_j − shift)`: the same sum, the same bits.
#[inline(always)]
pub(crate) fn exp_sum_in_place<const FMA: bool>(row: &mut [f32], shift: f32) -> f32 {
    let mut s = [0f32; LANES];
    let mut chunks = row.chunks_exact_mut(LANES);
    for c in chunks.by_ref() {
        for (s, v) in s.iter_mut().zip(c.iter_mut()) {
            *v = fast_exp::<FMA>(*v - shift);
            *s += *v;
        }
    }
    let tail: f32 = chunks
        .into_remainder()
        .iter_mut()
        .map(|v| {
            *v = fast_exp::<FMA>(*v - shift);
            *v
        })
        .sum();
    s.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_is_within_a_few_ulp() {
        let mut worst = 0f32;
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = x.exp();
            let got = fast_exp::<false>(x);
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(fast_exp::<false>(0.0), 1.0);
        assert!(fast_exp::<false>(f32::NEG_INFINITY) < 1e-37);
    }

    /// `fast_exp` as it was with the saturating `as i32` conversion of n.
    fn fast_exp_by_cast(x: f32) -> f32 {
        let x = x.clamp(-87.336_54, 88.722_83);
        let n = (x * std::f32::consts::LOG2_E + 0.5).floor();
        let r = n.mul_add(-0.693_359_4, x);
        let r = n.mul_add(2.121_944_4e-4, r);
        let mut p = 1.987_569_1e-4f32;
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            1.666_666_5e-1,
            0.5,
        ] {
            p = p.mul_add(r, c);
        }
        let y = p.mul_add(r * r, r) + 1.0;
        y * f32::from_bits(((n as i32 + 127).clamp(1, 254) as u32) << 23)
    }

    #[test]
    fn fast_exp_reads_the_exponent_as_the_cast_did() {
        let mut xs: Vec<f32> = vec![f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::MIN, 0.0];
        xs.extend([-87.336_54, 88.722_83, -87.34, 88.73, -1e30, 1e30, -0.5, 0.5]);
        let mut x = -200.0f32;
        while x < 200.0 {
            xs.push(x);
            x += 0.003_1;
        }
        for x in xs {
            assert_eq!(
                fast_exp::<true>(x).to_bits(),
                fast_exp_by_cast(x).to_bits(),
                "x = {x}"
            );
        }
        assert!(fast_exp::<true>(f32::NAN).is_nan());
    }

    #[test]
    fn row_reductions_match_the_plain_ones() {
        for len in [0usize, 1, 15, 16, 17, 1000] {
            let row: Vec<f32> = (0..len)
                .map(|i| ((i * 37 % 101) as f32) / 9.0 - 4.0)
                .collect();
            let want_max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(row_max(&row), want_max, "len {len}");
            let shift = if len == 0 { 0.0 } else { want_max };
            let want: f64 = row.iter().map(|&v| f64::from(v - shift).exp()).sum();
            let got = sum_exp::<false>(&row, shift);
            assert!(
                (f64::from(got) - want).abs() <= 1e-6 * want.max(1.0),
                "len {len}"
            );
            let mut stored = row.clone();
            assert_eq!(exp_sum_in_place::<false>(&mut stored, shift), got);
            for (s, &v) in stored.iter().zip(&row) {
                assert!((f64::from(*s) - f64::from(v - shift).exp()).abs() < 1e-6);
            }
        }
    }
}
