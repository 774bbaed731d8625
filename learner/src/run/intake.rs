//! Taking groups from the rollout source and filling one optimizer step's batch. What is
//! trained on is decided by the [`GroupFilter`] alone; this module only moves groups and
//! positions around.

use std::time::{Duration, Instant};

use cascade_shared::metrics::{ReplayErrorEvent, ReplaySkip, Warning};
use cascade_shared::outcomes::PromptTracker;
use cascade_shared::transport::{ReceivedGroup, RolloutSource, TransportError};
use cascade_shared::RolloutGroup;

use super::Learner;
use crate::error::Result;
use crate::filter::{DropReason, GroupFilter};

/// How often rank 0 of a group, waiting for rollouts, tells the other ranks it is alive.
const HEARTBEAT: Duration = Duration::from_secs(1);

/// The groups of one optimizer step.
#[derive(Debug, Default)]
pub(super) struct StepBatch {
    /// Groups to train on.
    pub(super) kept: Vec<RolloutGroup>,
    /// (stream, seq) of each kept group.
    pub(super) kept_ids: Vec<(String, u64)>,
    /// Every group of the stage that carried rewards (kept, equal-reward, stale): the reward
    /// statistics of the step.
    pub(super) seen: Vec<RolloutGroup>,
    /// Completed with equal-reward groups (zero advantages: the weights do not change).
    pub(super) no_signal: bool,
    /// Waiting time in seconds.
    pub(super) idle_s: f64,
}

impl<S: RolloutSource> Learner<'_, S> {
    /// The next group of the source, waiting; `None` when stopping.
    pub(super) fn next_group(&mut self, idle: &mut f64) -> Result<Option<ReceivedGroup<S::Mark>>> {
        loop {
            if let Some(g) = self.queue.pop_front() {
                return Ok(Some(g));
            }
            if self.stopping() {
                return Ok(None);
            }
            // About to wait: let the actors past what is decided (dropped groups and the
            // partial batch), or a batch that needs more groups than `max_inflight` would
            // never fill.
            let source = self
                .source
                .as_mut()
                .expect("only rank 0 reads the rollout source");
            if self.consumed != self.progressed {
                source.report_progress(&self.consumed)?;
                self.progressed = self.consumed.clone();
            }
            let t0 = Instant::now();
            let received = source.recv(Duration::from_millis(200));
            let gaps = source.take_gaps();
            // The other ranks of a group wait in a collective: a heartbeat tells them rank 0 is
            // alive and waiting for rollouts (their timeout then only catches a silent rank 0).
            if self.group.world_size() > 1 && self.heartbeat.elapsed() >= HEARTBEAT {
                super::group::broadcast_command(
                    self.group.as_mut(),
                    Some(&super::group::Command::Wait),
                )?;
                self.heartbeat = Instant::now();
            }
            let got = match received {
                Ok(g) => g,
                Err(e @ TransportError::Decode { .. }) => {
                    tracing::warn!("replay record skipped: {e}");
                    self.metrics.record(&ReplayErrorEvent {
                        error: Some(e.to_string()),
                    });
                    Vec::new()
                }
                Err(e) => return Err(e.into()),
            };
            for gap in gaps {
                self.metrics.record(&ReplaySkip {
                    actor: Some(gap.actor),
                    from_seq: Some(gap.from_seq),
                    to_seq: Some(gap.to_seq),
                });
            }
            let waited = t0.elapsed().as_secs_f64();
            *idle += waited;
            self.idle_s += waited;
            self.queue.extend(got);
        }
    }

    /// Fills the batch of one step of `batch_prompts` groups at the current policy version;
    /// `None` when stopping (the undecided groups stay in the log for the resumed run).
    pub(super) fn fill_batch(
        &mut self,
        filter: &mut GroupFilter,
        tracker: &mut PromptTracker,
        batch_prompts: usize,
        stage_name: &str,
    ) -> Result<Option<StepBatch>> {
        let version = self.state.policy_version;
        let mut batch = StepBatch::default();
        // Equal-reward groups held back for a no-signal step (the newest `batch_prompts`).
        let mut held: Vec<(String, u64, RolloutGroup)> = Vec::new();
        while batch.kept.len() < batch_prompts {
            let Some(rg) = self.next_group(&mut batch.idle_s)? else {
                return Ok(None);
            };
            // Decided from here on: the snapshot position moves past it.
            S::advance(&mut self.consumed, &rg);
            let rewards: Vec<f32> = rg.group.samples.iter().map(|s| s.reward).collect();
            match filter.admit(&rg.group, version) {
                Ok(()) => {
                    batch.kept_ids.push((rg.actor, rg.seq));
                    tracker.record(rg.group.prompt_id, &rewards);
                    batch.seen.push(rg.group.clone());
                    batch.kept.push(rg.group);
                }
                Err(DropReason::EqualRewards) => {
                    tracker.record(rg.group.prompt_id, &rewards);
                    batch.seen.push(rg.group.clone());
                    if held.len() >= batch_prompts {
                        held.remove(0);
                    }
                    held.push((rg.actor, rg.seq, rg.group));
                    if filter.no_signal_due(batch.kept.len() + held.len(), batch_prompts) {
                        let room = batch_prompts - batch.kept.len();
                        filter.admit_no_signal(room.min(held.len()));
                        for (actor, seq, group) in held.drain(..).take(room) {
                            batch.kept_ids.push((actor, seq));
                            batch.kept.push(group);
                        }
                        batch.no_signal = true;
                    }
                    let in_a_row = filter.equal_in_a_row();
                    if in_a_row == 4 * batch_prompts as u64 {
                        tracing::warn!(
                            "stage {stage_name}: the last {in_a_row} groups all had equal \
                             rewards (every sample right, or every sample wrong): nothing to \
                             learn from; is the task too hard or too easy for this model?"
                        );
                        self.metrics.record(&Warning {
                            stage: Some(stage_name.to_string()),
                            equal_reward_groups_in_a_row: Some(in_a_row),
                        });
                    }
                }
                Err(DropReason::Stale { .. }) => batch.seen.push(rg.group),
                Err(_) => {}
            }
        }
        Ok(Some(batch))
    }
}
