//! The stage the actor generates for: its dataset, verifier and sampling settings, and the
//! prompt schedule (this actor's share of the prompts in a seeded order per epoch, or, strictly
//! on-policy, the prompts of the learner's current step that every actor agrees on; retired
//! prompts come back only by chance).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use cascade_rewards::Verifier;
use cascade_shared::config::StageConfig;

use super::seeds::{mix, ORDER_SALT};
use super::ActorOptions;
use crate::dataset::{Dataset, PromptRecord};
use crate::engine::GenParams;
use crate::error::{ActorError, Result};
use crate::sampler::philox::uniform_bits;
use crate::sampler::{SampleKey, SamplingParams};
use crate::verifiers::build_verifier;
use cascade_shared::config::OutcomeConfig;
use cascade_shared::outcomes::PromptTracker;
use cascade_shared::snapshot::LearnerState;

/// The settings of the stage the actor works on.
pub(super) struct Stage {
    /// Index of the stage in the run config.
    pub(super) index: u32,
    /// The stage's settings.
    pub(super) config: StageConfig,
    /// Its prompts.
    pub(super) dataset: Dataset,
    /// Scores its samples.
    pub(super) verifier: Arc<dyn Verifier>,
    /// Sampling settings, response budget and this actor's seed.
    pub(super) params: GenParams,
    /// Samples per prompt (G).
    pub(super) group_size: usize,
    /// Position in this epoch's order.
    cursor: usize,
    /// Passes over the dataset so far (part of the mode draw and the generation seed).
    pub(super) epoch: u64,
    order: Vec<usize>,
    /// Strictly on-policy (staleness bound 0): the prompts of policy version `v` are a pure
    /// function of the learner's stage step, so a restarted actor regenerates exactly what an
    /// uninterrupted one would have.
    pub(super) on_policy: bool,
    /// On-policy: first global prompt index of the current version, and the next draw.
    base: u64,
    next_k: u64,
    /// On-policy: the shared (not per-actor) order of the current epoch.
    shared_order: Option<(u64, Vec<usize>)>,
    /// The learner's per-prompt outcomes (retired prompts are drawn with a small probability).
    tracker: Option<PromptTracker>,
}

impl Stage {
    /// Opens stage `index` at the learner's `stage_step` (the response budget follows the
    /// stage's curriculum): its dataset, its verifier (waiting for a reward model trained in
    /// the run) and the first epoch's prompt order.
    pub(super) fn open(
        opts: &ActorOptions,
        index: u32,
        stage_step: u64,
        seed: u64,
        stop: &AtomicBool,
    ) -> Result<Stage> {
        let cfg = &opts.config;
        let config = cfg
            .stages
            .get(index as usize)
            .ok_or_else(|| {
                ActorError::Invalid(format!("stage index {index} is not in the run config"))
            })?
            .clone();
        let (kind, domain) = config.data_kind();
        let spec = cfg
            .data_spec(&config.dataset, kind, domain)
            .map_err(|e| ActorError::Invalid(format!("stage {}: dataset {e}", config.name)))?;
        let dataset = Dataset::open(&spec)?;
        let verifier = build_verifier(index as usize, cfg, &opts.run_dir, &opts.device, stop)?;
        let o = &opts.overrides;
        let top_k = o.top_k.unwrap_or(cfg.actor.top_k);
        let sampling = SamplingParams {
            temperature: o.temperature.unwrap_or(config.temperature),
            top_k: (top_k > 0).then_some(top_k),
            top_p: Some(o.top_p.unwrap_or(config.top_p)),
        };
        sampling.validate()?;
        let max_new_tokens = o.max_new_tokens.unwrap_or_else(|| {
            config.max_response_tokens_at(stage_step as usize, cfg.actor.max_new_tokens)
        });
        let group_size = o.group_size.unwrap_or(config.group_size);
        let on_policy = config.max_staleness_or(cfg.learner.max_staleness) == 0;
        let mut stage = Stage {
            index,
            dataset,
            verifier,
            params: GenParams {
                sampling,
                max_new_tokens,
                seed,
            },
            group_size,
            cursor: 0,
            epoch: 0,
            order: Vec::new(),
            on_policy,
            base: 0,
            next_k: 0,
            shared_order: None,
            tracker: None,
            config,
        };
        stage.shuffle(opts);
        Ok(stage)
    }

    /// This actor's share of the prompts, in a seeded order per epoch.
    fn shuffle(&mut self, opts: &ActorOptions) {
        let actors = opts.config.devices.actor_assignment().len().max(1) as u64;
        let mine = opts.actor_id as u64 % actors;
        let n = self.dataset.len();
        let mut order: Vec<usize> = (0..n)
            .filter(|i| *i as u64 % actors == mine || n as u64 <= mine)
            .collect();
        let seed = self.params.seed ^ ORDER_SALT;
        let epoch = self.epoch;
        order.sort_by_key(|&i| {
            uniform_bits(&SampleKey {
                seed,
                stream: i as u64,
                position: epoch,
            })
        });
        self.order = order;
        self.cursor = 0;
    }

    /// On-policy: the prompt at global index `g` of the stage (every actor agrees on it).
    fn shared_prompt(&mut self, opts: &ActorOptions, g: u64) -> usize {
        let n = self.dataset.len() as u64;
        let epoch = g / n;
        if self.shared_order.as_ref().map(|(e, _)| *e) != Some(epoch) {
            let seed = opts.config.actor.seed ^ ORDER_SALT;
            let mut order: Vec<usize> = (0..n as usize).collect();
            order.sort_by_key(|&i| {
                uniform_bits(&SampleKey {
                    seed,
                    stream: i as u64,
                    position: epoch,
                })
            });
            self.shared_order = Some((epoch, order));
        }
        self.epoch = epoch;
        self.shared_order.as_ref().expect("just set").1[(g % n) as usize]
    }

    /// Starts the prompts of the learner's current policy version (on-policy mode) where its
    /// `state` says ([`schedule_base`]).
    pub(super) fn restart_for(&mut self, state: Option<&LearnerState>) {
        self.base = schedule_base(state, self.index, self.config.batch_prompts);
        self.next_k = 0;
    }

    /// The next prompt of the schedule, retired or not.
    fn draw(&mut self, opts: &ActorOptions) -> usize {
        if self.on_policy {
            let actors = opts.config.devices.actor_assignment().len().max(1) as u64;
            let mine = opts.actor_id as u64 % actors;
            let g = self.base + self.next_k * actors + mine;
            self.next_k += 1;
            return self.shared_prompt(opts, g);
        }
        if self.cursor >= self.order.len() {
            self.epoch += 1;
            self.shuffle(opts);
        }
        let i = self.order[self.cursor];
        self.cursor += 1;
        i
    }

    /// The next prompt, skipping retired ones unless they come back by chance (a bounded
    /// number of tries, so a fully retired dataset still yields prompts), read through the
    /// dataset's index.
    pub(super) fn next_prompt(&mut self, opts: &ActorOptions) -> Result<PromptRecord> {
        let tries = self.dataset.len().max(1);
        let mut i = self.draw(opts);
        for _ in 0..tries {
            let back = match self.tracker.as_mut() {
                None => true,
                Some(t) => t.should_draw(self.dataset.id(i)?),
            };
            if back {
                break;
            }
            i = self.draw(opts);
        }
        self.dataset.get(i)
    }

    /// Adopts the learner's prompt outcomes of this stage from a snapshot (with the run's
    /// `[outcomes]` settings, the learner's own).
    pub(super) fn set_tracker(&mut self, state: &LearnerState, outcomes: &OutcomeConfig) {
        self.tracker = match (&state.prompt_tracker, state.stage_index == self.index) {
            (Some(t), true) => PromptTracker::from_state(outcomes.clone(), t).ok(),
            _ => None,
        };
    }

    /// The generation seed of the current draw: per epoch, and per version when on-policy.
    pub(super) fn job_seed(&self, version: u64) -> u64 {
        if self.on_policy {
            mix(mix(self.params.seed, self.epoch), version)
        } else {
            mix(self.params.seed, self.epoch)
        }
    }
}

/// On-policy: where the next version's draws start in stage `index`'s shared prompt order for
/// the learner's `state`: after every group the learner has decided on in the stage (kept, or
/// dropped for equal rewards). Not `stage_step × batch_prompts`: dynamic filtering makes the
/// learner decide on several times `batch_prompts` groups a step (about 3× in the tiny
/// default's math stage), and each version then re-drew the prompts its predecessor had just
/// trained on or filtered out. States of earlier builds, which lack the count, keep that rule.
fn schedule_base(state: Option<&LearnerState>, index: u32, batch_prompts: usize) -> u64 {
    match state {
        Some(s) if s.stage_index == index => {
            let decided = s.stage_progress.groups_decided;
            if decided == 0 && s.stage_step > 0 {
                s.stage_step * batch_prompts as u64
            } else {
                decided
            }
        }
        _ => 0,
    }
}
