//! The fused attention op at a length whose `t × t` scores would be large: forward and backward
//! complete and the process's peak RSS grows by far less than one score matrix. Its own test
//! binary, so that no other test's allocations share the peak.

use std::sync::Arc;

use anyhow::{Context, Result};
use candle_core::{Device, Tensor, Var};
use cascade_shared::model::flash_attn::{flash_attn, Segments};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn randn(rng: &mut ChaCha8Rng, shape: &[usize]) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect();
    Ok(Tensor::from_vec(data, shape, &Device::Cpu)?)
}

// ---------------------------------------------------------------------------------------------
// Memory: a length whose score matrix alone would be 256 MiB (f32) per head.

#[test]
fn long_sequence_forward_and_backward_without_t_by_t() -> Result<()> {
    let t = 8192;
    let d = 64;
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let q = Var::from_tensor(&randn(&mut rng, &[1, 1, t, d])?)?;
    let k = Var::from_tensor(&randn(&mut rng, &[1, 1, t, d])?)?;
    let v = Var::from_tensor(&randn(&mut rng, &[1, 1, t, d])?)?;
    let before = peak_rss_kib();
    let out = flash_attn(&q, &k, &v, &Arc::new(Segments::causal(1, t)), None)?;
    let grads = out.sum_all()?.backward()?;
    let dq = grads.get(q.as_tensor()).context("dq")?;
    assert_eq!(dq.dims(), &[1, 1, t, d]);
    assert!(dq.abs()?.sum_all()?.to_scalar::<f32>()?.is_finite());
    // The first row attends only to itself: out[0] = v[0] exactly.
    let first = (out.get(0)?.get(0)?.get(0)? - v.get(0)?.get(0)?.get(0)?)?;
    assert!(first.abs()?.max(0)?.to_scalar::<f32>()? < 1e-6);
    if let (Some(before), Some(after)) = (before, peak_rss_kib()) {
        let grown = after.saturating_sub(before);
        eprintln!("t = {t}: peak RSS grew by {grown} KiB during forward + backward");
        // One t × t f32 matrix is 262 144 KiB; everything this op holds is O(t · d).
        assert!(grown < 64 * 1024, "peak RSS grew by {grown} KiB");
    }
    Ok(())
}

/// The process's peak resident set (`VmHWM`), where `/proc` has it.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
