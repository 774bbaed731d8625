//! The Bradley–Terry loss and the pairwise accuracy count.

use candle_core::{DType, Tensor};

use crate::error::Result;

/// Per-pair Bradley–Terry loss `−log σ(c − r) = softplus(r − c)`, `(n,)` f32, for chosen and
/// rejected scores `(n,)`.
///
/// `softplus(x)` is computed as `(x + |x|)/2 + ln(1 + e^{−|x|})`: no overflow for any `x`, and,
/// unlike `relu(x) + ln(1 + e^{−|x|})`, the right derivative (½) at `x = 0` whatever sign the
/// backward pass gives `|x|` there — which matters, because a zero head ties every pair.
pub fn pairwise_loss(chosen: &Tensor, rejected: &Tensor) -> Result<Tensor> {
    let x = (rejected.to_dtype(DType::F32)? - chosen.to_dtype(DType::F32)?)?;
    let abs = x.abs()?;
    let pos_part = ((&x + &abs)? * 0.5)?;
    let log_term = (abs.neg()?.exp()? + 1.0)?.log()?;
    Ok((pos_part + log_term)?)
}

/// Correct pairs of a batch, ties counting ½.
pub(super) fn count_correct(chosen: &[f32], rejected: &[f32]) -> f64 {
    chosen
        .iter()
        .zip(rejected)
        .map(|(c, r)| {
            if c > r {
                1.0
            } else if c == r {
                0.5
            } else {
                0.0
            }
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn softplus_f64(x: f64) -> f64 {
        x.max(0.0) + (-x.abs()).exp().ln_1p()
    }

    #[test]
    fn bt_loss_matches_the_formula() {
        let d = Device::Cpu;
        let c = [0.3f32, -1.2, 2.0, 0.0, 50.0, -60.0, 100.0];
        let r = [0.1f32, 0.4, 2.0, 0.0, -40.0, 60.0, -100.0];
        let ct = Tensor::new(&c, &d).unwrap();
        let rt = Tensor::new(&r, &d).unwrap();
        let loss = pairwise_loss(&ct, &rt).unwrap().to_vec1::<f32>().unwrap();
        for i in 0..c.len() {
            let dlt = c[i] as f64 - r[i] as f64;
            let expected = -(1.0 / (1.0 + (-dlt).exp())).ln();
            // −log σ(d) = softplus(−d), checked against the plain formula where it is exact.
            let expected = if expected.is_finite() {
                expected
            } else {
                softplus_f64(-dlt)
            };
            assert!(
                (loss[i] as f64 - expected).abs() <= 1e-6 * expected.max(1.0),
                "pair {i}: {} vs {expected}",
                loss[i]
            );
        }
        // Gradient wrt the chosen score: −σ(−d); at a tie exactly −½.
        let cv = Var::new(&c, &d).unwrap();
        let l = pairwise_loss(cv.as_tensor(), &rt)
            .unwrap()
            .sum_all()
            .unwrap();
        let g = l.backward().unwrap();
        let g = g.get(cv.as_tensor()).unwrap().to_vec1::<f32>().unwrap();
        for i in 0..c.len() {
            let dlt = c[i] as f64 - r[i] as f64;
            let expected = -1.0 / (1.0 + dlt.exp());
            assert!((g[i] as f64 - expected).abs() < 1e-6, "grad {i}: {}", g[i]);
        }
        assert_eq!(g[3], -0.5);
    }
}
