//! Starting a learner: a fresh run from the initial model (published as `v000000`), or a
//! resumed one from the newest complete snapshot.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use cascade_replay::ReaderOptions;
use cascade_shared::chat::Chat;
use cascade_shared::config::{DtypeChoice, LearnerConfig, StageConfig};
use cascade_shared::metrics::{MetricsLog, Resume};
use cascade_shared::model::{
    compute_dtype, initial_model, trainable_from_tensors, CausalLm, ModelConfig, Params,
};
use cascade_shared::snapshot::{
    self, LearnerState, CONFIG_FILE, OPTIMIZER_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE,
};
use cascade_shared::transport::{ReplaySource, RolloutSource};

use super::group::{OptimizerFiles, TrainOptimizer};
use super::settings::adamw_config;
use super::{Learner, LearnerOptions};
use crate::error::{LearnerError, Result};
use crate::optim::AdamW;
use crate::zero::ShardedAdamW;
use cascade_shared::collective::Collective;

/// The tokenizer files of the run (copied into every snapshot).
pub(super) struct TokenizerFiles {
    pub(super) tokenizer_json: Vec<u8>,
    pub(super) tokenizer_config_json: Option<Vec<u8>>,
    /// A directory holding them, for [`Chat::from_dir`].
    pub(super) dir: PathBuf,
}

impl TokenizerFiles {
    fn from_dir(dir: &Path) -> Result<Self> {
        let read = |p: PathBuf| std::fs::read(&p).map_err(|e| LearnerError::io(&p, e));
        let tokenizer_json = read(dir.join(TOKENIZER_FILE))?;
        let cfg = dir.join(TOKENIZER_CONFIG_FILE);
        let tokenizer_config_json = if cfg.exists() { Some(read(cfg)?) } else { None };
        Ok(TokenizerFiles {
            tokenizer_json,
            tokenizer_config_json,
            dir: dir.to_path_buf(),
        })
    }
}

/// The trained model and its variables.
pub(super) struct Policy {
    pub(super) cfg: ModelConfig,
    pub(super) model: CausalLm,
    pub(super) params: Params,
}

impl Policy {
    fn from_tensors(cfg: ModelConfig, tensors: HashMap<String, Tensor>) -> Result<Self> {
        let (model, params) = trainable_from_tensors(&cfg, tensors)?;
        Ok(Policy { cfg, model, params })
    }

    pub(super) fn named_tensors(&self) -> Vec<(String, Tensor)> {
        self.params
            .vars
            .iter()
            .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
            .collect()
    }

    /// A fresh optimizer for `stage`: AdamW in one process, its state sharded over a group.
    pub(super) fn optimizer(
        &self,
        stage: &StageConfig,
        learner: &LearnerConfig,
        group: &dyn Collective,
    ) -> Result<TrainOptimizer> {
        let vars = self
            .params
            .vars
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let cfg = adamw_config(stage, learner.max_bad_steps, learner.grad_accum);
        Ok(if group.world_size() == 1 {
            TrainOptimizer::Local(AdamW::new(vars, cfg)?)
        } else {
            TrainOptimizer::Sharded(ShardedAdamW::new(
                vars,
                cfg,
                group.rank(),
                group.world_size(),
            )?)
        })
    }
}

/// The dtype of the weights in memory.
fn weight_dtype(choice: DtypeChoice, device: &Device) -> DType {
    match choice {
        DtypeChoice::Auto => compute_dtype(device),
        DtypeChoice::F32 => DType::F32,
        DtypeChoice::Bf16 => DType::BF16,
        DtypeChoice::F16 => DType::F16,
    }
}

/// What a learner starts from.
struct Origin {
    policy: Policy,
    tokenizer: TokenizerFiles,
    state: LearnerState,
    /// The optimizer moments to restore (a stage resumed mid-way).
    optimizer_file: Option<OptimizerFiles>,
}

/// The run's initial model (its tokenizer materialised in `RUN_DIR/tokenizer/` for a random
/// init) and the state of a run that has not trained yet.
fn fresh(opts: &LearnerOptions) -> Result<Origin> {
    let dtype = weight_dtype(opts.config.model.dtype, &opts.device);
    let init = initial_model(
        &opts.config,
        dtype,
        &opts.device,
        &opts.run_dir.join("tokenizer"),
    )?;
    let position = <ReplaySource as RolloutSource>::Position::default();
    Ok(Origin {
        policy: Policy::from_tensors(init.cfg, init.tensors)?,
        tokenizer: TokenizerFiles::from_dir(&init.tokenizer_dir)?,
        state: LearnerState::initial(serialise_position(&position)?),
        optimizer_file: None,
    })
}

/// Everything a resumed learner needs from the snapshot in `dir`.
fn resumed(opts: &LearnerOptions, dir: &Path) -> Result<Origin> {
    let loaded = snapshot::load_snapshot(dir)?;
    let cfg = ModelConfig::from_file(&dir.join(CONFIG_FILE))?;
    let dtype = weight_dtype(opts.config.model.dtype, &opts.device);
    let tensors = snapshot::load_model(dir, &opts.device)?
        .into_iter()
        .map(|(k, t)| Ok((k, t.to_dtype(dtype)?)))
        .collect::<Result<HashMap<_, _>>>()?;
    tracing::info!(
        "resuming from snapshot v{} (step {}, stage {}, stage step {})",
        loaded.info.version,
        loaded.state.step,
        loaded.state.stage_index,
        loaded.state.stage_step
    );
    // Inside a stage the optimizer state is part of the snapshot; at a stage's step 0 the
    // stage starts with a fresh optimizer and the snapshot may carry weights only.
    let optimizer_file = if loaded.state.stage_step > 0 {
        let files = OptimizerFiles::of_snapshot(dir, loaded.info.manifest.files.keys())?;
        if files.is_none() {
            return Err(LearnerError::State(format!(
                "snapshot {} is at stage step {} but has no optimizer state ({OPTIMIZER_FILE} \
                 or optimizer.rank-R-of-W.safetensors)",
                dir.display(),
                loaded.state.stage_step
            )));
        }
        files
    } else {
        None
    };
    Ok(Origin {
        policy: Policy::from_tensors(cfg, tensors)?,
        tokenizer: TokenizerFiles::from_dir(dir)?,
        state: loaded.state,
        optimizer_file,
    })
}

/// The optimizer of the stage `state` is in (its saved state restored when the snapshot was
/// taken inside the stage) and the replay position `state` covers: what every rank rebuilds
/// from a snapshot.
fn restore_progress(
    opts: &LearnerOptions,
    policy: &Policy,
    state: &LearnerState,
    optimizer_file: Option<OptimizerFiles>,
    group: &dyn Collective,
) -> Result<(TrainOptimizer, <ReplaySource as RolloutSource>::Position)> {
    let config = &opts.config;
    // `RunConfig::validate` requires at least one stage.
    let stage_cfg = config
        .stages
        .get(state.stage_index as usize)
        .or(config.stages.last())
        .expect("a validated run config has a stage");
    let mut optimizer = policy.optimizer(stage_cfg, &config.learner, group)?;
    if let Some(file) = optimizer_file {
        optimizer.load(&file)?;
    }
    let consumed = serde_json::from_value(state.replay_cursors.clone())
        .map_err(|e| LearnerError::State(format!("snapshot replay position: {e}")))?;
    Ok((optimizer, consumed))
}

/// A transport position as stored in `state.json`.
pub(super) fn serialise_position<P: serde::Serialize>(position: &P) -> Result<serde_json::Value> {
    serde_json::to_value(position)
        .map_err(|e| LearnerError::State(format!("replay position does not serialise: {e}")))
}

impl<'a> Learner<'a, ReplaySource> {
    /// Starts (or, with `opts.resume`, resumes) the learner of `opts.run_dir`, reading the
    /// replay log under `RUN_DIR/replay`.
    pub(super) fn start(
        opts: &'a LearnerOptions,
        metrics: MetricsLog,
        stop: Arc<AtomicBool>,
        mut group: Box<dyn Collective>,
    ) -> Result<Self> {
        if group.rank() != 0 {
            return Self::follow(opts, stop, group);
        }
        let mut learner = Self::lead(opts, metrics, stop, group.as_mut())?;
        // Tell the other ranks which snapshot to start from (they wait for it).
        let mut version = learner.state.policy_version.to_le_bytes();
        group.broadcast(&mut version, 0)?;
        learner.group = group;
        Ok(learner)
    }

    /// A rank other than 0: waits for rank 0 to start (and publish the initial snapshot of a
    /// fresh run), then loads the snapshot rank 0 started from.
    fn follow(
        opts: &'a LearnerOptions,
        stop: Arc<AtomicBool>,
        mut group: Box<dyn Collective>,
    ) -> Result<Self> {
        let mut version = [0u8; 8];
        group.broadcast(&mut version, 0)?;
        let version = u64::from_le_bytes(version);
        let snapshots = opts.run_dir.join("snapshots");
        let dir = snapshots.join(snapshot::version_dir_name(version));
        let Origin {
            policy,
            tokenizer,
            state,
            optimizer_file,
        } = resumed(opts, &dir)?;
        let state_stage_step = state.stage_step;
        let chat = Chat::from_dir(&tokenizer.dir)?;
        let (optimizer, consumed) =
            restore_progress(opts, &policy, &state, optimizer_file, group.as_ref())?;
        Ok(Learner {
            opts,
            metrics: MetricsLog::disabled(),
            published: Some(version),
            snapshots,
            policy,
            tokenizer,
            chat,
            state,
            optimizer,
            source: None,
            group,
            queue: VecDeque::new(),
            progressed: consumed.clone(),
            consumed,
            steps_here: 0,
            checkpointed_at: state_stage_step,
            idle_s: 0.0,
            stop,
            heartbeat: Instant::now(),
        })
    }

    /// Rank 0 (or a single process): a fresh run publishes `v000000`, a resumed one restores
    /// the newest complete snapshot.
    fn lead(
        opts: &'a LearnerOptions,
        metrics: MetricsLog,
        stop: Arc<AtomicBool>,
        group: &mut dyn Collective,
    ) -> Result<Self> {
        let started = Instant::now();
        let snapshots = opts.run_dir.join("snapshots");
        // A resumed learner starts from the newest checkpoint (removing the weights-only
        // snapshots after it); without --resume nothing is touched.
        let newest = if opts.resume {
            crate::snapshot::latest_checkpoint(&snapshots)?
        } else {
            crate::snapshot::latest_complete(&snapshots)?
        };
        let origin = match newest {
            Some(info) if !opts.resume => {
                return Err(LearnerError::RunDir(format!(
                    "{} already holds snapshot v{}; pass --resume to continue that run, or \
                     use a new run directory",
                    opts.run_dir.display(),
                    info.version
                )));
            }
            Some(info) => resumed(opts, &info.dir)?,
            None => fresh(opts)?,
        };
        let Origin {
            policy,
            tokenizer,
            state,
            optimizer_file,
        } = origin;
        let state_stage_step = state.stage_step;
        let chat = Chat::from_dir(&tokenizer.dir)?;
        let (optimizer, consumed) = restore_progress(opts, &policy, &state, optimizer_file, group)?;
        let replay_root = opts.run_dir.join("replay");
        std::fs::create_dir_all(&replay_root).map_err(|e| LearnerError::io(&replay_root, e))?;
        let resume_at = (consumed != Default::default()).then(|| consumed.clone());
        let source = ReplaySource::open(&replay_root, ReaderOptions::default(), resume_at)?;
        let mut learner = Learner {
            opts,
            metrics,
            published: snapshot::read_latest(&snapshots),
            snapshots,
            policy,
            tokenizer,
            chat,
            state,
            optimizer,
            source: Some(source),
            // Replaced by the caller's group once started (a fresh run's initial publish
            // writes weights only and needs no collective).
            group: Box::new(cascade_shared::collective::Single),
            queue: VecDeque::new(),
            progressed: consumed.clone(),
            consumed,
            steps_here: 0,
            checkpointed_at: state_stage_step,
            idle_s: 0.0,
            stop,
            heartbeat: Instant::now(),
        };
        if learner.published.is_none() {
            // Version 0: the initial weights, kept as the start of stage 0.
            learner.publish(true)?;
        } else {
            learner.metrics.record(&Resume {
                policy_version: Some(learner.state.policy_version),
                step: Some(learner.state.step),
                stage_index: Some(u64::from(learner.state.stage_index)),
                stage_step: Some(learner.state.stage_step),
                resume_s: Some(started.elapsed().as_secs_f64()),
            });
        }
        Ok(learner)
    }
}
