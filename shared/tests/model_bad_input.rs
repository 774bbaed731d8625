//! Broken checkpoints give errors that name the file and the tensor.

use std::path::{Path, PathBuf};

use anyhow::Result;
use candle_core::{Device, Tensor};
use cascade_shared::model::load_model;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/model/qwen3-untied")
}

fn copy_fixture(to: &Path) -> Result<()> {
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture().join(f), to.join(f))?;
    }
    Ok(())
}

fn err_of(dir: &Path) -> String {
    format!("{}", load_model(dir, &Device::Cpu).expect_err("must fail"))
}

#[test]
fn missing_config() -> Result<()> {
    let d = tempfile::tempdir()?;
    let e = err_of(d.path());
    assert!(e.contains("config.json"), "{e}");
    Ok(())
}

#[test]
fn corrupt_config_names_file() -> Result<()> {
    let d = tempfile::tempdir()?;
    copy_fixture(d.path())?;
    std::fs::write(d.path().join("config.json"), "{ not json")?;
    let e = err_of(d.path());
    assert!(e.contains("config.json"), "{e}");
    std::fs::write(d.path().join("config.json"), r#"{"model_type": "mamba"}"#)?;
    let e = err_of(d.path());
    assert!(e.contains("mamba") && e.contains("qwen3"), "{e}");
    Ok(())
}

#[test]
fn truncated_safetensors_names_file_and_tensor() -> Result<()> {
    let d = tempfile::tempdir()?;
    copy_fixture(d.path())?;
    let p = d.path().join("model.safetensors");
    let bytes = std::fs::read(&p)?;
    std::fs::write(&p, &bytes[..bytes.len() - 1000])?;
    let e = err_of(d.path());
    assert!(
        e.contains("model.safetensors") && e.contains("tensor `"),
        "{e}"
    );
    std::fs::write(&p, &bytes[..5])?;
    let e = err_of(d.path());
    assert!(e.contains("model.safetensors"), "{e}");
    Ok(())
}

#[test]
fn wrong_shape_and_missing_tensor() -> Result<()> {
    let d = tempfile::tempdir()?;
    copy_fixture(d.path())?;
    let cfg_path = d.path().join("config.json");
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cfg_path)?)?;
    cfg["intermediate_size"] = serde_json::json!(64);
    std::fs::write(&cfg_path, cfg.to_string())?;
    let e = err_of(d.path());
    assert!(
        e.contains("model.safetensors") && e.contains("mlp") && e.contains("shape"),
        "{e}"
    );
    cfg["intermediate_size"] = serde_json::json!(96);
    cfg["num_hidden_layers"] = serde_json::json!(3);
    std::fs::write(&cfg_path, cfg.to_string())?;
    let e = err_of(d.path());
    assert!(e.contains("missing tensor `model.layers.2."), "{e}");
    Ok(())
}

#[test]
fn sharded_checkpoint_loads() -> Result<()> {
    let d = tempfile::tempdir()?;
    copy_fixture(d.path())?;
    let src = d.path().join("model.safetensors");
    let tensors = candle_core::safetensors::load(&src, &Device::Cpu)?;
    std::fs::remove_file(&src)?;
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    let (a, b) = names.split_at(names.len() / 2);
    let mut map = serde_json::Map::new();
    for (file, part) in [
        ("model-00001-of-00002.safetensors", a),
        ("model-00002-of-00002.safetensors", b),
    ] {
        let sub: std::collections::HashMap<String, Tensor> = part
            .iter()
            .map(|n| ((*n).clone(), tensors[*n].clone()))
            .collect();
        candle_core::safetensors::save(&sub, d.path().join(file))?;
        for n in part {
            map.insert((*n).clone(), serde_json::json!(file));
        }
    }
    std::fs::write(
        d.path().join("model.safetensors.index.json"),
        serde_json::json!({ "weight_map": map }).to_string(),
    )?;
    let sharded = load_model(d.path(), &Device::Cpu)?;
    let single = load_model(&fixture(), &Device::Cpu)?;
    let ids = Tensor::new(&[[1u32, 2, 3, 4]], &Device::Cpu)?;
    let diff = (sharded.forward_logits(&ids, None)? - single.forward_logits(&ids, None)?)?
        .abs()?
        .sum_all()?
        .to_scalar::<f32>()?;
    assert_eq!(diff, 0.0);
    Ok(())
}

#[test]
fn a_user_checkpoint_that_changes_while_loading_is_refused() -> Result<()> {
    use cascade_shared::model::{Checkpoint, ModelConfig};
    let d = tempfile::tempdir()?;
    copy_fixture(d.path())?;
    let cfg = ModelConfig::from_file(&d.path().join("config.json"))?;
    let ckpt = Checkpoint::open_dir(d.path())?;
    // Loads while the file is as it was at open.
    ckpt.load_all(&cfg, candle_core::DType::F32, &Device::Cpu)?;
    // Another process appends to it (a save in progress): the next read is refused.
    let p = d.path().join("model.safetensors");
    let mut f = std::fs::OpenOptions::new().append(true).open(&p)?;
    std::io::Write::write_all(&mut f, &[0u8; 64])?;
    drop(f);
    let e = ckpt
        .load_all(&cfg, candle_core::DType::F32, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("model.safetensors") && e.contains("changed"),
        "{e}"
    );
    Ok(())
}
