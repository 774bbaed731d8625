//! How the actor starts: it waits until there are weights to generate with (the newest
//! snapshot once the learner is in an RL stage, or the run's initial model when the cascade
//! starts with one) and finds the RL stage to work on.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cascade_shared::chat::Chat;
use cascade_shared::config::{RunConfig, StageConfig};
use cascade_shared::model::{compute_dtype, initial_model as run_initial_model, CausalLm};
use cascade_shared::snapshot::{self, LearnerState};

use super::ActorOptions;
use crate::error::Result;
use crate::snapshot_watch::SnapshotWatch;

/// How the actor starts: weights, tokenizer, version and the learner's position.
pub(super) struct Start {
    pub(super) model: CausalLm,
    pub(super) chat: Chat,
    pub(super) version: u64,
    pub(super) state: Option<LearnerState>,
}

/// Waits for weights to generate with: the newest snapshot once the learner is in an RL stage
/// (actors idle while it runs SFT stages), or the run's initial model when the cascade starts
/// with an RL stage and nothing is published yet. `None`: stopped, or no RL stage is left.
pub(super) fn wait_for_weights(
    opts: &ActorOptions,
    watch: &mut SnapshotWatch,
    stop: &AtomicBool,
) -> Result<Option<Start>> {
    let stages = &opts.config.stages;
    let snapshots = opts.run_dir.join("snapshots");
    let mut logged = false;
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(None);
        }
        match latest_stage(&snapshots) {
            Some((_, idx)) if rl_stage_from(&opts.config, idx).is_none() => {
                tracing::info!("the learner is past the last RL stage; nothing to do");
                return Ok(None);
            }
            Some((_, idx)) if !stages[idx as usize].is_rl() && !logged => {
                tracing::info!(
                    "waiting while the learner runs SFT stage {}",
                    stages[idx as usize].name
                );
                logged = true;
            }
            Some((_, idx)) if !stages[idx as usize].is_rl() => {}
            Some(_) => {
                if let Some(w) = watch.poll(None)? {
                    let chat = Chat::from_dir(&w.dir)?;
                    return Ok(Some(Start {
                        model: w.model,
                        chat,
                        version: w.version,
                        state: Some(w.state),
                    }));
                }
            }
            None if stages.first().is_some_and(StageConfig::is_rl) => {
                let (model, chat) = initial_model(opts)?;
                watch.set_current(0)?;
                return Ok(Some(Start {
                    model,
                    chat,
                    version: 0,
                    state: None,
                }));
            }
            None => {}
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Initial weights when no snapshot is published yet: the run's initial model
/// ([`cascade_shared::model::initial_model`], the learner's own), in the device's compute
/// dtype, its tokenizer materialised in `RUN_DIR/actor-I-tokenizer` for a random init.
fn initial_model(opts: &ActorOptions) -> Result<(CausalLm, Chat)> {
    let scratch = opts
        .run_dir
        .join(format!("actor-{}-tokenizer", opts.actor_id));
    let init = run_initial_model(
        &opts.config,
        compute_dtype(&opts.device),
        &opts.device,
        &scratch,
    )?;
    Ok((
        CausalLm::from_tensors(&init.cfg, &init.tensors)?,
        Chat::from_dir(&init.tokenizer_dir)?,
    ))
}

/// Index of the first RL stage at or after `index`.
pub(super) fn rl_stage_from(config: &RunConfig, index: u32) -> Option<u32> {
    (index as usize..config.stages.len())
        .find(|&i| config.stages[i].is_rl())
        .map(|i| i as u32)
}

/// The version `LATEST` names and the stage index in its `state.json` (cheap: no weights).
fn latest_stage(snapshots: &Path) -> Option<(u64, u32)> {
    snapshot::peek_latest_state(snapshots).map(|(v, state)| (v, state.stage_index))
}
