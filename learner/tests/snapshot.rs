//! Snapshot publishing, crash leftovers, corruption, retention, and exact resume.

mod common;

use std::path::Path;

use anyhow::Result;
use candle_core::{Device, Tensor};
use candle_nn::VarMap;
use cascade_learner::snapshot::{latest_complete, publish, restore_varmap, retain, SnapshotInput};
use cascade_learner::train_step::accumulate_grpo_gradients;
use cascade_learner::{AdamW, AdamWConfig, GrpoBatch, GrpoConfig, PolicyModel};
use cascade_shared::snapshot::{
    load_snapshot, read_latest, verify, FilterMetrics, LearnerState, StageProgress, COMPLETE_FILE,
    MODEL_FILE, OPTIMIZER_FILE, STATE_FORMAT_VERSION,
};
use cascade_shared::RolloutGroup;
use common::{fixture_dir, stand_in, varmap_from};

fn model_tensors(varmap: &VarMap) -> Vec<(String, Tensor)> {
    let data = varmap.data().lock().unwrap();
    let mut v: Vec<_> = data
        .iter()
        .map(|(k, var)| (k.clone(), var.as_tensor().clone()))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn state(step: u64) -> LearnerState {
    LearnerState {
        format_version: STATE_FORMAT_VERSION,
        step,
        policy_version: step,
        stage_index: 1,
        stage_step: step,
        replay_cursors: serde_json::json!({"actor-0": {"segment": 2, "offset": 4096}}),
        stage_progress: StageProgress {
            reference_version: Some(step / 2),
            equal_in_a_row: 1,
            groups_decided: 9,
        },
        filter_metrics: FilterMetrics {
            seen: step,
            ..FilterMetrics::default()
        },
        prompt_tracker: None,
        checkpoint: true,
    }
}

fn publish_version(
    dir: &Path,
    varmap: &VarMap,
    opt: &AdamW,
    v: u64,
    stage_final: bool,
) -> Result<()> {
    let model = model_tensors(varmap);
    publish(
        dir,
        v,
        &SnapshotInput {
            model: &model,
            optimizer: Some(opt),
            state: &state(v),
            config_json: br#"{"model_type": "stand_in"}"#,
            tokenizer_json: b"{}",
            extra_files: &[],
            stage_final,
        },
    )?;
    Ok(())
}

fn groups() -> Result<Vec<RolloutGroup>> {
    Ok(serde_json::from_str(&std::fs::read_to_string(
        fixture_dir().join("groups.json"),
    )?)?)
}

/// One GRPO step of the stand-in model on the fixture batch.
fn train_step(
    policy: &dyn PolicyModel,
    opt: &mut AdamW,
    batch: &GrpoBatch,
    cfg: &GrpoConfig,
) -> Result<()> {
    let stats = accumulate_grpo_gradients::<dyn PolicyModel, dyn PolicyModel>(
        policy,
        None,
        batch,
        4,
        cfg,
        opt,
        &Device::Cpu,
    )?;
    opt.step(1e-2, stats.loss)?;
    Ok(())
}

fn weights(varmap: &VarMap) -> Result<Vec<(String, Vec<f32>)>> {
    model_tensors(varmap)
        .into_iter()
        .map(|(k, t)| Ok((k, t.flatten_all()?.to_vec1::<f32>()?)))
        .collect()
}

#[test]
fn publish_then_find_and_load() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("snapshots");
    let vars = varmap_from(&fixture_dir().join("policy.safetensors"))?;
    let opt = AdamW::from_varmap(&vars, AdamWConfig::default())?;
    for v in 1..=3 {
        publish_version(&dir, &vars, &opt, v, false)?;
    }
    assert_eq!(read_latest(&dir), Some(3));
    assert!(dir.join("v000003").join(COMPLETE_FILE).exists());
    // A published version is never rewritten.
    assert!(publish_version(&dir, &vars, &opt, 3, false).is_err());

    let info = latest_complete(&dir)?.expect("a snapshot");
    assert_eq!(info.version, 3);
    let loaded = load_snapshot(&info.dir)?;
    assert_eq!(loaded.state, state(3));

    // Weights load back bit-identically into a fresh VarMap of the same shapes.
    let fresh = varmap_from(&fixture_dir().join("reference.safetensors"))?;
    restore_varmap(&fresh, &info.dir)?;
    assert_eq!(weights(&fresh)?, weights(&vars)?);
    Ok(())
}

#[test]
fn interrupted_and_corrupt_snapshots_are_skipped() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("snapshots");
    let vars = varmap_from(&fixture_dir().join("policy.safetensors"))?;
    let opt = AdamW::from_varmap(&vars, AdamWConfig::default())?;
    for v in 1..=3 {
        publish_version(&dir, &vars, &opt, v, false)?;
    }
    // A publish killed mid-way: a .tmp directory with some files, and a stale LATEST.tmp.
    let partial = dir.join("v000004.tmp");
    std::fs::create_dir(&partial)?;
    std::fs::write(partial.join(MODEL_FILE), b"half a file")?;
    std::fs::write(dir.join("LATEST.tmp"), b"4")?;
    // v3 is damaged after publication (one flipped byte).
    let model = dir.join("v000003").join(MODEL_FILE);
    let mut bytes = std::fs::read(&model)?;
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&model, bytes)?;
    assert!(verify(&dir.join("v000003")).is_err());
    // v2 lost its completion marker (as if the rename happened before the marker: it cannot,
    // but a hand-copied directory might).
    std::fs::remove_file(dir.join("v000002").join(COMPLETE_FILE))?;

    let info = latest_complete(&dir)?.expect("v1 is intact");
    assert_eq!(info.version, 1);
    assert!(!partial.exists(), "interrupted .tmp is cleaned up");
    assert!(!dir.join("LATEST.tmp").exists());
    assert_eq!(
        read_latest(&dir),
        Some(1),
        "LATEST repointed at the snapshot in use"
    );

    let empty = tmp.path().join("none");
    assert!(latest_complete(&empty)?.is_none());
    Ok(())
}

#[test]
fn retention_keeps_recent_stage_final_and_acknowledged() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("snapshots");
    let vars = varmap_from(&fixture_dir().join("policy.safetensors"))?;
    let opt = AdamW::from_varmap(&vars, AdamWConfig::default())?;
    for v in 1..=6 {
        publish_version(&dir, &vars, &opt, v, v == 2)?;
    }
    std::fs::create_dir_all(dir.join("acks"))?;
    std::fs::write(dir.join("acks").join("actor-0"), b"3\n")?;
    std::fs::write(dir.join("acks").join("actor-1"), b"6\n")?;
    let deleted = retain(&dir, 2)?;
    assert_eq!(deleted, vec![4, 1]);
    for (v, present) in [
        (1, false),
        (2, true),
        (3, true),
        (4, false),
        (5, true),
        (6, true),
    ] {
        assert_eq!(dir.join(format!("v{v:06}")).exists(), present, "v{v}");
    }
    // Actor 0 moved on: v3 can go now.
    std::fs::write(dir.join("acks").join("actor-0"), b"6\n")?;
    assert_eq!(retain(&dir, 2)?, vec![3]);
    assert!(std::fs::read_dir(&dir)?.all(|e| !e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .ends_with(".tmp")));
    Ok(())
}

/// `learner.checkpoint_every`: snapshots that are not checkpoints hold weights only; retention
/// keeps the newest checkpoint however many weights-only snapshots follow it, and
/// `latest_checkpoint` goes back to it, removing the later ones and pointing `LATEST` at it.
#[test]
fn the_newest_checkpoint_is_kept_and_resumed_from() -> Result<()> {
    use cascade_learner::snapshot::latest_checkpoint;
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("snapshots");
    let vars = varmap_from(&fixture_dir().join("policy.safetensors"))?;
    let opt = AdamW::from_varmap(&vars, AdamWConfig::default())?;
    let model = model_tensors(&vars);
    // v1..v3 checkpoints, v4..v7 weights only.
    for v in 1..=7u64 {
        let checkpoint = v <= 3;
        let st = LearnerState {
            checkpoint,
            ..state(v)
        };
        let input = SnapshotInput {
            model: &model,
            optimizer: checkpoint.then_some(&opt as &dyn cascade_learner::optim::OptimizerState),
            state: &st,
            config_json: br#"{"model_type": "stand_in"}"#,
            tokenizer_json: b"{}",
            extra_files: &[],
            stage_final: false,
        };
        publish(&dir, v, &input)?;
        assert_eq!(
            dir.join(format!("v{v:06}"))
                .join("optimizer.safetensors")
                .exists(),
            checkpoint
        );
    }
    // A weights-only snapshot given optimizer state, or a checkpoint without it, is refused.
    let wrong = LearnerState {
        checkpoint: false,
        ..state(8)
    };
    let e = publish(
        &dir,
        8,
        &SnapshotInput {
            model: &model,
            optimizer: Some(&opt),
            state: &wrong,
            config_json: b"{}",
            tokenizer_json: b"{}",
            extra_files: &[],
            stage_final: false,
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("weights only"), "{e}");
    // The newest two (v7, v6) and the newest checkpoint (v3) stay.
    assert_eq!(retain(&dir, 2)?, vec![5, 4, 2, 1]);
    let left: Vec<bool> = (1..=7)
        .map(|v| dir.join(format!("v{v:06}")).exists())
        .collect();
    assert_eq!(left, [false, false, true, false, false, true, true]);
    let info = latest_checkpoint(&dir)?.expect("a checkpoint");
    assert_eq!(info.version, 3);
    assert_eq!(cascade_shared::snapshot::read_latest(&dir), Some(3));
    for v in 6..=7 {
        assert!(!dir.join(format!("v{v:06}")).exists(), "v{v} removed");
    }
    // Idempotent.
    assert_eq!(latest_checkpoint(&dir)?.map(|i| i.version), Some(3));
    Ok(())
}

#[test]
fn resume_from_snapshot_is_bit_identical() -> Result<()> {
    let cfg = GrpoConfig::default();
    let batch = GrpoBatch::from_groups(&groups()?, &cfg)?;
    let opt_cfg = AdamWConfig::default();

    // Uninterrupted: 4 steps.
    let vars = varmap_from(&fixture_dir().join("policy.safetensors"))?;
    let policy = stand_in(&vars)?;
    let mut opt = AdamW::from_varmap(&vars, opt_cfg.clone())?;
    for _ in 0..4 {
        train_step(&policy, &mut opt, &batch, &cfg)?;
    }
    let uninterrupted = weights(&vars)?;

    // Interrupted: 2 steps, publish, then a fresh process restores and does 2 more.
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("snapshots");
    {
        let vars = varmap_from(&fixture_dir().join("policy.safetensors"))?;
        let policy = stand_in(&vars)?;
        let mut opt = AdamW::from_varmap(&vars, opt_cfg.clone())?;
        for _ in 0..2 {
            train_step(&policy, &mut opt, &batch, &cfg)?;
        }
        publish_version(&dir, &vars, &opt, 2, false)?;
        // One more step and a publish that dies before its rename.
        train_step(&policy, &mut opt, &batch, &cfg)?;
        std::fs::create_dir(dir.join("v000003.tmp"))?;
        std::fs::write(dir.join("v000003.tmp").join(OPTIMIZER_FILE), b"partial")?;
    }
    let info = latest_complete(&dir)?.expect("v2");
    assert_eq!(info.version, 2);
    // Start from different weights to prove everything comes from the snapshot.
    let vars = varmap_from(&fixture_dir().join("reference.safetensors"))?;
    restore_varmap(&vars, &info.dir)?;
    let policy = stand_in(&vars)?;
    let mut opt = AdamW::from_varmap(&vars, opt_cfg)?;
    opt.load(&info.dir.join(OPTIMIZER_FILE))?;
    assert_eq!(opt.steps(), 2);
    for _ in 0..2 {
        train_step(&policy, &mut opt, &batch, &cfg)?;
    }
    assert_eq!(
        weights(&vars)?,
        uninterrupted,
        "resumed weights must be bit-identical"
    );
    Ok(())
}
