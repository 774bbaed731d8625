//! Model throughput, printed as JSON lines for `scripts/bench-model.sh` (which runs PyTorch on
//! the same checkpoint in the same script run and prints the ratios).
//!
//! `cargo bench -p cascade-shared --bench model -- MODEL_DIR [train_batch train_len]
//! [--checkpoint=K] [--train-only]`: `--checkpoint=K` checkpoints every K-th decoder layer in
//! the train measurement (as `learner.activation_checkpointing`); `--train-only` skips decode.
//! `--prefill=LEN,CHUNK` measures only the prefill of one LEN-token prompt, CHUNK tokens a pass.

use std::path::PathBuf;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use cascade_shared::model::{argmax, load_model, load_trainable, DecodeBatch};

/// The allocator and pool settings of the `cascade` binary (src/main.rs), so that the bench
/// measures the model as the learner and the actor run it.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    cascade_shared::device::set_cpu_pool_defaults();
    cascade_shared::device::keep_freed_memory();
    let all: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&String> = all.iter().filter(|a| !a.starts_with("--")).collect();
    let checkpoint: usize = all
        .iter()
        .find_map(|a| a.strip_prefix("--checkpoint="))
        .map(str::parse)
        .transpose()?
        .unwrap_or(0);
    let train_only = all.iter().any(|a| a == "--train-only");
    let prefill: Option<(usize, usize)> = all
        .iter()
        .find_map(|a| a.strip_prefix("--prefill="))
        .map(|v| -> anyhow::Result<(usize, usize)> {
            let (len, chunk) = v.split_once(',').unwrap_or((v, v));
            Ok((len.parse()?, chunk.parse()?))
        })
        .transpose()?;
    let Some(dir) = args.first().map(|a| PathBuf::from(a.as_str())) else {
        eprintln!("usage: model MODEL_DIR [train_batch train_len]");
        return Ok(());
    };
    if let Some((len, chunk)) = prefill {
        return prefill_bench(&dir, len, chunk);
    }
    let train_batch: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(4);
    let train_len: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(128);
    let dev = Device::Cpu;
    let (mut model, _params) = load_trainable(&dir, DType::F32, &dev)?;
    model.set_checkpoint_every(checkpoint);
    let vocab = model.config().vocab_size as u32;
    let ids: Vec<u32> = (0..train_batch * train_len)
        .map(|i| (i as u32 * 7919 + 13) % vocab)
        .collect();
    let input = Tensor::from_vec(ids, (train_batch, train_len), &dev)?;
    // Forward + backward of the summed log-probs; one warm-up, then the best of 10 (of 2 past
    // 2048 tokens, as bench_model_torch.py): a short step's best of 3 moved by ±15 % between
    // runs of the same binary on a shared machine.
    let tokens = train_batch * train_len;
    let runs = if tokens > 2048 { 3 } else { 11 };
    let mut best = f64::MAX;
    for i in 0..runs {
        let t = Instant::now();
        let loss = model.token_logprob_sum(&input, None)?;
        let grads = loss.backward()?;
        std::hint::black_box(grads);
        if i > 0 {
            best = best.min(t.elapsed().as_secs_f64());
        }
    }
    let tokens = tokens as f64;
    println!("{{\"bench\": \"train\", \"batch\": {train_batch}, \"len\": {train_len}, \"tokens_per_s\": {}}}", tokens / best);
    drop(model);
    if train_only {
        return Ok(());
    }
    let model = load_model(&dir, &dev)?;
    let prompt_len = 16;
    let steps = 64;
    for batch in [1usize, 8] {
        let mut best = f64::MAX;
        for _ in 0..2 {
            // The actors' cache: a budget of every row at its longest, allocated at once.
            let mut b = DecodeBatch::with_kv_budget(batch, batch * (prompt_len + steps + 1));
            let prompts: Vec<Vec<u32>> = (0..batch)
                .map(|r| {
                    (0..prompt_len)
                        .map(|i| ((r * 31 + i * 17) as u32) % vocab)
                        .collect()
                })
                .collect();
            let rows: Vec<(usize, &[u32])> = prompts
                .iter()
                .enumerate()
                .map(|(i, p)| (i, p.as_slice()))
                .collect();
            let mut logits = model.prefill(&mut b, &rows)?;
            let t = Instant::now();
            for _ in 0..steps {
                let l: Vec<Vec<f32>> = logits.to_vec2()?;
                let feed: Vec<(usize, u32)> =
                    l.iter().enumerate().map(|(i, r)| (i, argmax(r))).collect();
                logits = model.decode_step(&mut b, &feed)?;
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!("{{\"bench\": \"decode\", \"batch\": {batch}, \"steps\": {steps}, \"tokens_per_s\": {}}}", (batch * steps) as f64 / best);
    }
    Ok(())
}

/// `--prefill=LEN,CHUNK`: the prefill of one `LEN`-token prompt into an actor's cache, `CHUNK`
/// tokens a pass (`CausalLm::extend` after the first), best of 3; prints its tokens/s and the
/// process's peak RSS (run one setting per process to compare memory).
fn prefill_bench(dir: &std::path::Path, len: usize, chunk: usize) -> anyhow::Result<()> {
    let model = load_model(dir, &Device::Cpu)?;
    let vocab = model.config().vocab_size as u32;
    let prompt: Vec<u32> = (0..len).map(|i| (i as u32 * 7919 + 13) % vocab).collect();
    let mut best = f64::MAX;
    for _ in 0..3 {
        let mut b = DecodeBatch::with_kv_budget(1, len);
        b.set_prefill_chunk(chunk);
        let t = Instant::now();
        std::hint::black_box(model.prefill(&mut b, &[(0, &prompt)])?);
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "{{\"bench\": \"prefill\", \"len\": {len}, \"chunk\": {chunk}, \"tokens_per_s\": {}, \"peak_rss_mb\": {}}}",
        len as f64 / best,
        cascade_shared::metrics::peak_rss_mb().unwrap_or(0.0)
    );
    Ok(())
}
