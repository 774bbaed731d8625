//! Training the run's `[reward_model]` from the policy's current weights (wired to
//! [`crate::reward_train`]).

use std::path::Path;

use candle_core::{Device, Tensor};
use cascade_shared::chat::Chat;
use cascade_shared::config::{RewardModelTrainConfig, RunConfig};
use cascade_shared::metrics::MetricsLog;
use cascade_shared::model::ModelConfig;

use crate::error::{LearnerError, Result};

/// Trains the reward model of `[reward_model]` starting from `weights` and saves it in `out`.
#[allow(clippy::too_many_arguments)]
pub fn train_for_run(
    _cfg: &ModelConfig,
    _weights: &[(String, Tensor)],
    _chat: &Chat,
    _tokenizer_json: &[u8],
    _tokenizer_config_json: Option<&[u8]>,
    _rm: &RewardModelTrainConfig,
    _config: &RunConfig,
    out: &Path,
    _micro_batch: usize,
    _seed: u64,
    _metrics: &MetricsLog,
    _device: &Device,
) -> Result<()> {
    Err(LearnerError::InvalidConfig(format!(
        "reward-model training into {} is not wired yet",
        out.display()
    )))
}
