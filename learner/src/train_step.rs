//! One GRPO gradient computation over a batch, micro-batch by micro-batch.

use std::ops::Range;

use candle_core::{DType, Device, Tensor};

use crate::batch::GrpoBatch;
use crate::error::{LearnerError, Result};
use crate::grpo::{grpo_loss, GrpoConfig, GrpoStats};
use crate::optim::GradientSink;
use crate::policy::PolicyModel;

/// Runs forward + backward on each micro-batch of at most `micro_batch` training rows and adds
/// the gradients to `optimizer`'s accumulator. A row is one sample, or, in a batch packed with
/// [`GrpoBatch::with_token_budget`], up to `token_budget` tokens of samples of one temperature:
/// a micro-batch then holds at most `micro_batch × token_budget` tokens. Only one micro-batch's
/// activations are alive at a time, so peak memory follows the micro-batch, not the batch size.
/// The losses use the full batch's denominator, so the accumulated gradient equals the
/// full-batch gradient, whatever the micro-batch size or the layout.
/// The caller then calls [`AdamW::step`] with `stats.loss`.
pub fn accumulate_grpo_gradients<P, R>(
    policy: &P,
    reference: Option<&R>,
    batch: &GrpoBatch,
    micro_batch: usize,
    cfg: &GrpoConfig,
    optimizer: &mut dyn GradientSink,
    device: &Device,
) -> Result<GrpoStats>
where
    P: PolicyModel + ?Sized,
    R: PolicyModel + ?Sized,
{
    let all = batch.micro_batch_ranges(micro_batch);
    accumulate_grpo_gradients_part(
        policy,
        reference,
        batch,
        micro_batch,
        0..all.len(),
        cfg,
        optimizer,
        device,
    )
}

/// [`accumulate_grpo_gradients`] over the micro-batches `part` of the batch's
/// [`GrpoBatch::micro_batch_ranges`] only: one rank's share of a step in a learner group. The
/// losses keep the full batch's denominator, so the gradients of all parts sum to the batch
/// gradient, and each micro-batch is the one a single process would run.
#[allow(clippy::too_many_arguments)]
pub fn accumulate_grpo_gradients_part<P, R>(
    policy: &P,
    reference: Option<&R>,
    batch: &GrpoBatch,
    micro_batch: usize,
    part: Range<usize>,
    cfg: &GrpoConfig,
    optimizer: &mut dyn GradientSink,
    device: &Device,
) -> Result<GrpoStats>
where
    P: PolicyModel + ?Sized,
    R: PolicyModel + ?Sized,
{
    if cfg.kl_coef > 0.0 && reference.is_none() {
        return Err(LearnerError::InvalidCall(
            "kl_coef > 0 needs a reference model".into(),
        ));
    }
    let mut total = GrpoStats::default();
    let ranges = batch.micro_batch_ranges(micro_batch);
    let mine = ranges.get(part.clone()).ok_or_else(|| {
        LearnerError::InvalidCall(format!(
            "micro-batches {part:?} of a batch of {}",
            ranges.len()
        ))
    })?;
    for range in mine.iter().cloned() {
        let mb = batch.micro_batch(range, device)?;
        // The LM head runs at the trained positions only (not the prompts'); the log-probs
        // go back onto the (b, t - 1) grid the loss works on (0 elsewhere, masked out).
        let (b, t) = mb.input_ids.dims2()?;
        let grid = |values: Tensor| -> Result<Tensor> {
            let zeros = Tensor::zeros(b * (t - 1), DType::F32, values.device())?;
            Ok(zeros
                .index_add(&mb.selected, &values, 0)?
                .reshape((b, t - 1))?)
        };
        let logprobs = grid(policy.token_logprobs_at_selected(
            &mb.input_ids,
            &mb.attention_mask,
            &mb.temperatures,
            &mb.selected,
        )?)?;
        let ref_logprobs = match reference {
            Some(r) if cfg.kl_coef > 0.0 => Some(
                grid(r.token_logprobs_at_selected(
                    &mb.input_ids,
                    &mb.attention_mask,
                    &mb.temperatures,
                    &mb.selected,
                )?)?
                .detach(),
            ),
            _ => None,
        };
        let out = grpo_loss(
            &logprobs,
            &mb,
            ref_logprobs.as_ref(),
            cfg,
            batch.normaliser(),
        )?;
        let grads = out.loss.backward()?;
        total.add(&out.stats);
        // The graph (every activation backward kept) goes before the gradients are added.
        drop((out, logprobs, ref_logprobs));
        optimizer.accumulate(&grads)?;
    }
    Ok(total)
}
