//! The peak-RSS growth of the fused attention against `t`; then the fused op against the
//! unfused candle-ops path (scores + dense mask + softmax), forward + backward, same process.
//!
//! `cargo bench -p cascade-shared --bench flash_attn -- [heads kv_heads head_dim lengths...]`
//! (default: 16 heads, 8 kv heads, head_dim 128 — Qwen3-0.6B's attention — at t = 512, 2048).

use std::sync::Arc;
use std::time::Instant;

use candle_core::{Device, Tensor, Var, D};
use cascade_shared::model::flash_attn::{flash_attn, Segments};

fn inputs(heads: usize, kv: usize, t: usize, d: usize) -> candle_core::Result<[Var; 3]> {
    let dev = Device::Cpu;
    Ok([
        Var::from_tensor(&Tensor::randn(0f32, 1.0, (1, heads, t, d), &dev)?)?,
        Var::from_tensor(&Tensor::randn(0f32, 1.0, (1, kv, t, d), &dev)?)?,
        Var::from_tensor(&Tensor::randn(0f32, 1.0, (1, kv, t, d), &dev)?)?,
    ])
}

/// The model's unfused attention: GQA as grouped rows, a dense causal bias, softmax.
fn unfused(q: &Tensor, k: &Tensor, v: &Tensor) -> candle_core::Result<Tensor> {
    let (b, nh, t, d) = q.dims4()?;
    let nkv = k.dim(1)?;
    let rep = nh / nkv;
    let bias: Vec<f32> = (0..t * t)
        .map(|x| {
            if x % t <= x / t {
                0.0
            } else {
                f32::NEG_INFINITY
            }
        })
        .collect();
    let bias = Tensor::from_vec(bias, (1, 1, 1, t, t), &Device::Cpu)?;
    let scores = (q.reshape((b, nkv, rep * t, d))?.matmul(&k.t()?)? * (1.0 / (d as f64).sqrt()))?
        .reshape((b, nkv, rep, t, t))?
        .broadcast_add(&bias)?;
    let max = scores.max_keepdim(D::Minus1)?.detach();
    let e = scores.broadcast_sub(&max)?.exp()?;
    let p = e
        .broadcast_div(&e.sum_keepdim(D::Minus1)?)?
        .reshape((b, nkv, rep * t, t))?;
    p.matmul(v)?.reshape((b, nh, t, d))
}

fn time_fwd_bwd(
    f: &dyn Fn(&Tensor, &Tensor, &Tensor) -> candle_core::Result<Tensor>,
    [q, k, v]: &[Var; 3],
) -> candle_core::Result<(f64, f64)> {
    let (mut fwd, mut total) = (f64::MAX, f64::MAX);
    for i in 0..3 {
        let start = Instant::now();
        let out = f(q, k, v)?;
        let loss = out.sum_all()?;
        let mid = start.elapsed().as_secs_f64();
        let grads = loss.backward()?;
        std::hint::black_box(grads);
        if i > 0 {
            fwd = fwd.min(mid);
            total = total.min(start.elapsed().as_secs_f64());
        }
    }
    Ok((fwd, total))
}

/// Resets the peak-RSS counter (`VmHWM`) of this process; Linux only.
fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn rss_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn main() -> candle_core::Result<()> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (heads, kv, d) = match args.as_slice() {
        [h, k, d, ..] => (*h, *k, *d),
        _ => (16, 8, 128),
    };
    let lengths = if args.len() > 3 {
        args[3..].to_vec()
    } else {
        vec![512, 2048]
    };
    // Peak RSS growth of the fused op (1 head, d = 64) against t, first, before the unfused
    // path's large buffers make the allocator keep freed memory resident. The growth includes
    // the O(t · d) inputs' gradients, output and the backward's packed copies.
    for t in [1024usize, 2048, 4096, 8192, 16384] {
        let vars = inputs(1, 1, t, 64)?;
        let segments = Arc::new(Segments::causal(1, t));
        reset_peak();
        let base = rss_kib("VmRSS:");
        let out = flash_attn(&vars[0], &vars[1], &vars[2], &segments, None)?;
        let grads = out.sum_all()?.backward()?;
        std::hint::black_box(&grads);
        let grown = rss_kib("VmHWM:").saturating_sub(base);
        println!(
            "{{\"bench\": \"fused_attention_peak_rss\", \"t\": {t}, \"head_dim\": 64, \
             \"peak_growth_kib\": {grown}, \"t_by_t_f32_kib\": {}}}",
            t * t * 4 / 1024
        );
    }
    let threads = rayon::current_num_threads();
    for &t in &lengths {
        let vars = inputs(heads, kv, t, d)?;
        let segments = Arc::new(Segments::causal(1, t));
        let fused = move |q: &Tensor, k: &Tensor, v: &Tensor| flash_attn(q, k, v, &segments, None);
        let (ff, ft) = time_fwd_bwd(&fused, &vars)?;
        let (uf, ut) = time_fwd_bwd(&unfused, &vars)?;
        println!(
            "{{\"bench\": \"attention\", \"heads\": {heads}, \"kv_heads\": {kv}, \"head_dim\": {d}, \
             \"t\": {t}, \"threads\": {threads}, \"fused_fwd_s\": {ff:.4}, \"fused_fwd_bwd_s\": {ft:.4}, \
             \"unfused_fwd_s\": {uf:.4}, \"unfused_fwd_bwd_s\": {ut:.4}, \"speedup_fwd_bwd\": {:.2}}}",
            ut / ft
        );
    }
    Ok(())
}
