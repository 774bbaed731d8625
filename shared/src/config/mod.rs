//! The run configuration: one TOML file describes a run (model, devices, throughput knobs,
//! the cascade of stages), and every knob can be overridden from the command line.
//!
//! Loading goes file → `--set KEY=VALUE` overrides (on the TOML tree) → typed flags
//! ([`ActorArgs`], [`LearnerArgs`], [`ReplayArgs`]) → [`RunConfig::validate`]. Every table
//! denies unknown keys; errors name the key path and the allowed keys, values or type.

mod dataset;
mod devices;
mod error;
mod extra;
mod knobs;
mod model;
mod outcomes;
mod overrides;
mod stage;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use dataset::DatasetEntry;
pub use devices::{parse_devices, Device, DeviceSpec, DevicesConfig};
pub use error::{ConfigError, Result};
pub use extra::{EvalConfig, RewardModelTrainConfig};
pub use knobs::{
    ActorArgs, ActorConfig, GradAccum, LearnerArgs, LearnerConfig, ReplayArgs, ReplayConfig,
};
pub use model::{DtypeChoice, InitConfig, ModelConfig};
pub use outcomes::OutcomeConfig;
pub use overrides::Override;
pub use stage::{
    IfStrictness, KlEstimator, LossAgg, MaxResponseTokens, Schedule, SftMix, StageConfig,
    VerifierConfig,
};

use error::invalid;

/// Directory of the reward model `[reward_model]` trains, inside the run directory.
pub const TRAINED_REWARD_MODEL_DIR: &str = "reward_model";

/// A whole run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// The starting model.
    pub model: ModelConfig,
    /// Where the learner and actors run.
    #[serde(default)]
    pub devices: DevicesConfig,
    /// Actor throughput and sampling knobs.
    #[serde(default)]
    pub actor: ActorConfig,
    /// Learner throughput and snapshot knobs.
    #[serde(default)]
    pub learner: LearnerConfig,
    /// Replay log sizing.
    #[serde(default)]
    pub replay: ReplayConfig,
    /// The cascade, in order: SFT stages, then RL stages.
    #[serde(default)]
    pub stages: Vec<StageConfig>,
    /// A reward model to train inside the run (for `rlhf` stages without their own).
    #[serde(default)]
    pub reward_model: Option<RewardModelTrainConfig>,
    /// The held-out evaluation after each stage.
    #[serde(default)]
    pub eval: EvalConfig,
    /// Per-prompt outcome tracking: prompts always or never solved are retired.
    #[serde(default)]
    pub outcomes: OutcomeConfig,
    /// Directory relative paths are resolved against (the config file's directory).
    #[serde(skip)]
    pub base_dir: PathBuf,
}

/// The typed command-line overrides, grouped for flattening into a subcommand.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConfigArgs {
    /// The run configuration (TOML).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override any key: `--set stages.2.lr=1e-6`, `--set stages.math.group_size=16`,
    /// `--set devices.actors='["cuda:0-6"]'`. Repeatable; applied in order, before the
    /// typed flags.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Actor knobs.
    #[command(flatten)]
    pub actor: ActorArgs,
    /// Learner knobs.
    #[command(flatten)]
    pub learner: LearnerArgs,
    /// Replay knobs.
    #[command(flatten)]
    pub replay: ReplayArgs,
}

impl ConfigArgs {
    /// Loads `--config` (or `default_toml` when none was given, with relative paths resolved
    /// against `default_base`), applies every override and validates.
    pub fn load(&self, default_toml: &str, default_base: &Path) -> Result<RunConfig> {
        let overrides = self
            .set
            .iter()
            .map(|s| s.parse())
            .collect::<Result<Vec<Override>>>()?;
        let mut config = match &self.config {
            Some(path) => RunConfig::load_unvalidated(path, &overrides)?,
            None => RunConfig::parse_unvalidated(
                default_toml,
                "the embedded default config",
                default_base,
                &overrides,
            )?,
        };
        self.actor.apply(&mut config.actor);
        self.learner.apply(&mut config.learner);
        self.replay.apply(&mut config.replay);
        config.validate()?;
        Ok(config)
    }
}

/// Prompt tokens per row that an automatic KV-cache budget (`actor.kv_cache_tokens = 0`)
/// allows for.
pub const AUTO_KV_PROMPT_TOKENS: usize = 2048;

impl RunConfig {
    /// Reads, overrides and validates a config file. Relative paths in it are resolved
    /// against the file's directory.
    pub fn load(path: impl AsRef<Path>, overrides: &[Override]) -> Result<Self> {
        let config = Self::load_unvalidated(path, overrides)?;
        config.validate()?;
        Ok(config)
    }

    /// Parses, overrides and validates TOML text; `source_name` appears in errors.
    pub fn parse(
        text: &str,
        source_name: &str,
        base_dir: &Path,
        overrides: &[Override],
    ) -> Result<Self> {
        let config = Self::parse_unvalidated(text, source_name, base_dir, overrides)?;
        config.validate()?;
        Ok(config)
    }

    fn load_unvalidated(path: impl AsRef<Path>, overrides: &[Override]) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let base = path.parent().unwrap_or(Path::new("")).to_path_buf();
        Self::parse_unvalidated(&text, &path.display().to_string(), &base, overrides)
    }

    fn parse_unvalidated(
        text: &str,
        source_name: &str,
        base_dir: &Path,
        overrides: &[Override],
    ) -> Result<Self> {
        let table: toml::Table = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            source_name: source_name.to_string(),
            message: e.to_string().trim_end().to_string(),
        })?;
        let mut doc = toml::Value::Table(table);
        for o in overrides {
            o.apply(&mut doc)?;
        }
        let mut config: RunConfig =
            serde_path_to_error::deserialize(doc).map_err(|e| ConfigError::Schema {
                source_name: source_name.to_string(),
                key: display_path(e.path()),
                message: e.inner().to_string(),
            })?;
        config.base_dir = base_dir.to_path_buf();
        Ok(config)
    }

    /// The longest response of any RL stage (`actor.max_new_tokens` where a stage sets none).
    pub fn longest_response(&self) -> usize {
        self.stages
            .iter()
            .filter(|s| s.is_rl())
            .map(|s| s.longest_response(self.actor.max_new_tokens))
            .max()
            .unwrap_or(self.actor.max_new_tokens)
    }

    /// The KV-cache budget of each actor, in tokens, for a policy of `context` tokens
    /// (`max_position_embeddings`): `actor.kv_cache_tokens`, or when 0, `gen_batch` rows of
    /// [`AUTO_KV_PROMPT_TOKENS`] + the longest response of any RL stage, each capped at the
    /// context.
    pub fn actor_kv_tokens(&self, context: usize) -> usize {
        if self.actor.kv_cache_tokens > 0 {
            return self.actor.kv_cache_tokens;
        }
        let row = context.min(AUTO_KV_PROMPT_TOKENS + self.longest_response());
        self.actor.gen_batch.max(1) * row.max(1)
    }

    /// Cross-field checks: a non-empty stage list with unique names, SFT stages before RL
    /// stages, each stage's ranges (group size ≥ 2, 0 < top_p ≤ 1, curriculum shape, ...),
    /// model `path` xor `init`, device strings, and the throughput knobs' minimums.
    pub fn validate(&self) -> Result<()> {
        self.model.validate()?;
        self.devices.validate()?;
        self.actor.validate()?;
        self.learner.validate()?;
        self.replay.validate()?;
        self.eval.validate()?;
        self.outcomes.validate()?;
        if let Some(rm) = &self.reward_model {
            rm.validate()?;
        }
        if self.stages.is_empty() {
            return Err(invalid(
                "stages",
                "the run needs at least one [[stages]] entry (kinds: sft, rlhf, if, math, code, swe)",
            ));
        }
        let mut seen_rl: Option<&str> = None;
        for (i, stage) in self.stages.iter().enumerate() {
            let at = format!("stages[{i}]");
            stage.validate(&at, self.reward_model.is_some())?;
            stage.check_token_budget(&at, self.learner.token_budget, self.actor.max_new_tokens)?;
            if self.stages[..i].iter().any(|s| s.name == stage.name) {
                return Err(invalid(
                    format!("{at}.name"),
                    format!("stage name {:?} is used twice", stage.name),
                ));
            }
            if let Some(mix) = &stage.sft_mix {
                for (k, name) in mix.replay.iter().enumerate() {
                    let earlier = self.stages[..i].iter().find(|s| &s.name == name);
                    if !earlier.is_some_and(|s| s.is_rl()) {
                        return Err(invalid(
                            format!("{at}.sft_mix.replay[{k}]"),
                            format!(
                                "{name:?} is not an RL stage before {:?} (replay takes the best \
                                 responses of earlier RL stages)",
                                stage.name
                            ),
                        ));
                    }
                }
            }
            match (stage.is_rl(), seen_rl) {
                (true, None) => seen_rl = Some(&stage.name),
                (false, Some(rl)) => {
                    return Err(invalid(
                        format!("{at}.kind"),
                        format!(
                        "SFT stage {:?} comes after RL stage {rl:?}; SFT stages must come first",
                        stage.name
                    ),
                    ))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Whether a later stage's `sft_mix.replay` names stage `index` (whose best responses the
    /// learner then records).
    pub fn replayed_later(&self, index: usize) -> bool {
        let Some(stage) = self.stages.get(index) else {
            return false;
        };
        self.stages[index + 1..].iter().any(|s| {
            s.sft_mix
                .as_ref()
                .is_some_and(|m| m.replay.iter().any(|n| n == &stage.name))
        })
    }

    /// Checks that every file the config names exists (datasets, held-out sets, model path
    /// or init config, reward models, init tokenizer).
    pub fn check_files(&self) -> Result<()> {
        let mut files: Vec<(String, &Path)> = Vec::new();
        if let Some(p) = &self.model.path {
            files.push(("model.path".into(), p));
        }
        if let Some(init) = &self.model.init {
            files.push(("model.init.config".into(), &init.config));
            if let Some(t) = &init.tokenizer {
                files.push(("model.init.tokenizer".into(), t));
            }
        }
        let mut datasets: Vec<(String, &DatasetEntry)> = Vec::new();
        for (i, s) in self.stages.iter().enumerate() {
            datasets.push((format!("stages[{i}].dataset"), &s.dataset));
            if let Some(h) = &s.heldout {
                datasets.push((format!("stages[{i}].heldout"), h));
            }
            if let Some(mix) = &s.sft_mix {
                datasets.push((format!("stages[{i}].sft_mix.dataset"), &mix.dataset));
            }
            if let Some(rm) = &s.verifier.reward_model {
                files.push((format!("stages[{i}].verifier.reward_model"), rm));
            }
            if let Some(judge) = &s.verifier.swe_judge {
                files.push((format!("stages[{i}].verifier.swe_judge"), judge));
            }
        }
        if let Some(rm) = &self.reward_model {
            datasets.push(("reward_model.dataset".into(), &rm.dataset));
            if let Some(h) = &rm.heldout {
                datasets.push(("reward_model.heldout".into(), h));
            }
        }
        for (key, entry) in datasets {
            if entry.is_pattern() {
                // A glob must match at least one dataset file.
                let pattern = self.resolve(&entry.path);
                if crate::data::reader::resolve_files(&pattern.display().to_string()).is_err() {
                    return Err(ConfigError::MissingFile { key, path: pattern });
                }
            } else {
                files.push((key, &entry.path));
            }
        }
        for (key, path) in files {
            let resolved = self.resolve(path);
            if !resolved.exists() {
                return Err(ConfigError::MissingFile {
                    key,
                    path: resolved,
                });
            }
        }
        Ok(())
    }

    /// A path from the config, resolved against [`RunConfig::base_dir`] when relative.
    pub fn resolve(&self, path: impl AsRef<Path>) -> PathBuf {
        let path = path.as_ref();
        if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.base_dir.join(path)
        }
    }

    /// Where the reward model of stage `index` lives: its own `verifier.reward_model`, else the
    /// one `[reward_model]` trains into `RUN_DIR/reward_model`; `None` if it has neither.
    pub fn reward_model_dir(&self, index: usize, run_dir: &Path) -> Option<PathBuf> {
        let stage = self.stages.get(index)?;
        match &stage.verifier.reward_model {
            Some(p) => Some(self.resolve(p)),
            None if self.reward_model.is_some() => Some(run_dir.join(TRAINED_REWARD_MODEL_DIR)),
            None => None,
        }
    }

    /// Whether stage `index` uses the reward model `[reward_model]` trains.
    pub fn uses_trained_reward_model(&self, index: usize) -> bool {
        self.stages.get(index).is_some_and(|s| {
            self.reward_model.is_some()
                && s.verifier.reward_model.is_none()
                && (s.kind == crate::StageKind::Rlhf || s.verifier.rm_weight > 0.0)
        })
    }

    /// The stage called `name`.
    pub fn stage(&self, name: &str) -> Option<&StageConfig> {
        self.stages.iter().find(|s| s.name == name)
    }
}

/// `stages[2].lr` from serde_path_to_error's path (which prints `stages[2].lr` already, or
/// `.` for the root).
fn display_path(path: &serde_path_to_error::Path) -> String {
    let text = path.to_string();
    if text == "." {
        "(top level)".to_string()
    } else {
        text
    }
}
