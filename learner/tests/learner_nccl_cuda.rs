//! The sharded optimizer's collectives on the GPU's own buffers (issue 17), built with
//! `--features cuda,nccl` by `scripts/build-gpu.sh` (libnccl linked: a stub at build time, the
//! GPU host's library at run time) and run by `scripts/gpu-check.sh`. Apart from
//! `learner_cuda.rs` so that a host without libnccl loses this test only.
#![cfg(all(feature = "cuda", feature = "nccl"))]

mod cuda_common;

use std::collections::HashMap;

use anyhow::{ensure, Result};
use candle_core::Device;
use cascade_learner::optim::AdamWConfig;
use cascade_learner::sft::accumulate_sft_gradients;
use cascade_learner::zero::{GroupSink, ShardedAdamW, BUCKET};
use cascade_shared::collective::{Collective, Single};
use cascade_shared::model::{random_weights, trainable_from_tensors};
use cascade_shared::nccl::NcclGroup;
use cuda_common::{gpu, rows, small_config};

/// Two SFT steps (forward, backward, the sharded AdamW of a learner group) on the GPU with the
/// NCCL collectives of a one-rank group, whose tensor forms hand the device's buffers to NCCL,
/// give bit for bit the weights the one-process backend gives (for one rank both reductions are
/// the identity, so any difference is a wrong offset, chunk or copy): with the default bucket
/// and with 100 000-element buckets (many buckets, the last one padded). Skipped, with a line,
/// where NCCL's library is missing.
#[test]
fn one_rank_nccl_learner_steps_on_device_buffers_match_the_one_process_backend() -> Result<()> {
    let cfg = small_config()?;
    let tensors = random_weights(&cfg, 11, &Device::Cpu)?;
    for bucket in [BUCKET, 100_000] {
        let mut results = Vec::new();
        for nccl in [false, true] {
            let mut group: Box<dyn Collective> = if nccl {
                match NcclGroup::new(Box::new(Single), 0, std::time::Duration::from_secs(60)) {
                    Ok(g) => Box::new(g),
                    Err(e) => {
                        eprintln!("skipped: {e}");
                        return Ok(());
                    }
                }
            } else {
                Box::new(Single)
            };
            let on_gpu = tensors
                .iter()
                .map(|(k, t)| Ok((k.clone(), t.to_device(&gpu())?)))
                .collect::<Result<HashMap<_, _>>>()?;
            let (model, params) = trainable_from_tensors(&cfg, on_gpu)?;
            let vars: Vec<_> = params.vars.clone().into_iter().collect();
            let mut opt =
                ShardedAdamW::new(vars, AdamWConfig::default(), 0, 1)?.with_bucket(bucket)?;
            let batch = rows(cfg.vocab_size as u32);
            for _ in 0..2 {
                let stats = {
                    let mut sink = GroupSink::new(&mut opt, group.as_mut());
                    let stats = accumulate_sft_gradients(&model, &batch, 1, &mut sink, &gpu())?;
                    sink.finish(batch.len())?;
                    stats
                };
                opt.step(1e-3, stats.loss, group.as_mut())?;
            }
            let mut weights: Vec<(String, Vec<f32>)> = params
                .vars
                .iter()
                .map(|(k, v)| {
                    Ok((
                        k.clone(),
                        v.as_tensor()
                            .to_device(&Device::Cpu)?
                            .flatten_all()?
                            .to_vec1::<f32>()?,
                    ))
                })
                .collect::<Result<_>>()?;
            weights.sort_by(|a, b| a.0.cmp(&b.0));
            results.push(weights);
        }
        ensure!(
            results[0] == results[1],
            "bucket {bucket}: NCCL and one-process steps differ"
        );
        eprintln!("bucket {bucket}: two one-rank NCCL learner steps on device buffers are bit-identical to the one-process backend's");
    }
    Ok(())
}
