//! Checkpoint files: the parameter list of a config, loading single or sharded safetensors
//! (memory-mapped, validated, with errors naming file and tensor), seeded random initialisation
//! and saving in the Hugging Face layout.
//!
//! This is the only module of the crate that maps files. A mapped checkpoint must not change
//! while it is open: cascade only maps published snapshots (written as `*.tmp`, fsynced and
//! renamed, never rewritten) and user checkpoints, and copies every tensor out of the mapping
//! before the file is closed.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use candle_core::safetensors::Load;
use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use safetensors::tensor::{Metadata, TensorView};

use super::config::ModelConfig;
use super::{ModelError, Result};

/// Every parameter of the model described by `cfg`, with its Hugging Face name and shape, in a
/// stable order. A tied head has no `lm_head.weight`.
pub fn parameter_shapes(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let h = cfg.hidden_size;
    let hd = cfg.head_dim();
    let nh = cfg.num_attention_heads;
    let nkv = cfg.num_kv_heads();
    let i = cfg.intermediate_size;
    let mut out = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![cfg.vocab_size, h],
    )];
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        out.push((format!("{p}.input_layernorm.weight"), vec![h]));
        out.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
        for (name, rows) in [
            ("q_proj", nh * hd),
            ("k_proj", nkv * hd),
            ("v_proj", nkv * hd),
        ] {
            out.push((format!("{p}.self_attn.{name}.weight"), vec![rows, h]));
            if cfg.qkv_bias() {
                out.push((format!("{p}.self_attn.{name}.bias"), vec![rows]));
            }
        }
        out.push((format!("{p}.self_attn.o_proj.weight"), vec![h, nh * hd]));
        if cfg.o_bias() {
            out.push((format!("{p}.self_attn.o_proj.bias"), vec![h]));
        }
        if cfg.qk_norm() {
            out.push((format!("{p}.self_attn.q_norm.weight"), vec![hd]));
            out.push((format!("{p}.self_attn.k_norm.weight"), vec![hd]));
        }
        for (name, shape) in [
            ("gate_proj", [i, h]),
            ("up_proj", [i, h]),
            ("down_proj", [h, i]),
        ] {
            out.push((format!("{p}.mlp.{name}.weight"), shape.to_vec()));
            if cfg.mlp_bias {
                out.push((format!("{p}.mlp.{name}.bias"), vec![shape[0]]));
            }
        }
    }
    out.push(("model.norm.weight".to_string(), vec![h]));
    if !cfg.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![cfg.vocab_size, h]));
    }
    out
}

/// Seeded random weights in the Hugging Face initialisation: normal(0, `initializer_range`) for
/// matrices, ones for norms, zeros for biases. Each tensor has its own stream derived from
/// (seed, name), so the values do not depend on the order of creation.
pub fn random_weights(
    cfg: &ModelConfig,
    seed: u64,
    device: &Device,
) -> Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    for (name, shape) in parameter_shapes(cfg) {
        let n: usize = shape.iter().product();
        let data: Vec<f32> = if name.ends_with("norm.weight") {
            vec![1.0; n]
        } else if name.ends_with(".bias") {
            vec![0.0; n]
        } else {
            let mut rng = ChaCha8Rng::seed_from_u64(seed ^ fnv1a(name.as_bytes()));
            let std = cfg.initializer_range as f32;
            (0..n).map(|_| std * standard_normal(&mut rng)).collect()
        };
        out.insert(name, Tensor::from_vec(data, shape, device)?);
    }
    Ok(out)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Box–Muller: one standard normal draw.
fn standard_normal(rng: &mut impl Rng) -> f32 {
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random::<f64>();
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
}

/// Writes `tensors` as one `model.safetensors` file (in `dtype`). Tensor order in the file is
/// sorted by name, so the bytes are deterministic.
pub fn save_safetensors(
    tensors: &HashMap<String, Tensor>,
    dtype: DType,
    path: &Path,
) -> Result<()> {
    let sorted: BTreeMap<&String, Tensor> = tensors
        .iter()
        .map(|(k, v)| Ok((k, v.to_dtype(dtype)?.to_device(&Device::Cpu)?)))
        .collect::<Result<_>>()?;
    let views: Vec<(&String, &Tensor)> = sorted.iter().map(|(k, v)| (*k, v)).collect();
    safetensors::tensor::serialize_to_file(views, None, path).map_err(|e| ModelError::Safetensors {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

struct MappedFile {
    path: PathBuf,
    mmap: memmap2::Mmap,
    /// Start of the data section (8 + header length).
    data_start: usize,
}

struct TensorEntry {
    file: usize,
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

/// An opened checkpoint: one `model.safetensors` or the shards listed in
/// `model.safetensors.index.json`. Headers are parsed and bounds-checked at open.
pub struct Checkpoint {
    files: Vec<MappedFile>,
    tensors: HashMap<String, TensorEntry>,
}

impl Checkpoint {
    /// Opens the safetensors file(s) of a checkpoint directory.
    pub fn open_dir(dir: &Path) -> Result<Checkpoint> {
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        if single.exists() {
            return Checkpoint::open_files(&[single]);
        }
        if index.exists() {
            let text = std::fs::read_to_string(&index).map_err(|e| ModelError::Io {
                path: index.clone(),
                source: e,
            })?;
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| ModelError::Safetensors {
                    path: index.clone(),
                    message: format!("not valid JSON: {e}"),
                })?;
            let map = json
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| ModelError::Safetensors {
                    path: index.clone(),
                    message: "no `weight_map` object".into(),
                })?;
            let mut files: Vec<PathBuf> = Vec::new();
            for file in map.values() {
                let file = file.as_str().ok_or_else(|| ModelError::Safetensors {
                    path: index.clone(),
                    message: "`weight_map` values must be file names".into(),
                })?;
                let p = dir.join(file);
                if !files.contains(&p) {
                    files.push(p);
                }
            }
            let ckpt = Checkpoint::open_files(&files)?;
            for (name, file) in map {
                let expected = dir.join(file.as_str().unwrap_or_default());
                match ckpt.tensors.get(name) {
                    Some(e) if ckpt.files[e.file].path == expected => {}
                    _ => {
                        return Err(ModelError::MissingTensor {
                            path: expected,
                            name: name.clone(),
                        });
                    }
                }
            }
            return Ok(ckpt);
        }
        Err(ModelError::Io {
            path: single,
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "neither model.safetensors nor model.safetensors.index.json exists",
            ),
        })
    }

    /// Opens explicit safetensors files.
    pub fn open_files(paths: &[PathBuf]) -> Result<Checkpoint> {
        let mut files = Vec::new();
        let mut tensors = HashMap::new();
        for (idx, path) in paths.iter().enumerate() {
            let file = File::open(path).map_err(|e| ModelError::Io {
                path: path.clone(),
                source: e,
            })?;
            // SAFETY: the mapping is read-only and the file is a checkpoint that is never modified
            // while open (published snapshots are immutable; see the module docs). Every access
            // below is bounds-checked against the parsed header before slicing.
            let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| ModelError::Io {
                path: path.clone(),
                source: e,
            })?;
            let st_err = |message: String| ModelError::Safetensors {
                path: path.clone(),
                message,
            };
            let (header_len, meta): (usize, Metadata) =
                safetensors::SafeTensors::read_metadata(&mmap).map_err(|e| {
                    st_err(format!("bad header: {e}{}", describe_truncation(&mmap)))
                })?;
            let data_start = 8 + header_len;
            let data_len = mmap.len().saturating_sub(data_start);
            for (name, info) in meta.tensors() {
                let (s, e) = info.data_offsets;
                if e > data_len || s > e {
                    return Err(st_err(format!(
                        "tensor `{name}` lies outside the file (offsets {s}..{e}, data is {data_len} bytes): truncated?"
                    )));
                }
                tensors.insert(
                    name.clone(),
                    TensorEntry {
                        file: idx,
                        dtype: info.dtype,
                        shape: info.shape.clone(),
                        start: data_start + s,
                        end: data_start + e,
                    },
                );
            }
            files.push(MappedFile {
                path: path.clone(),
                mmap,
                data_start,
            });
        }
        Ok(Checkpoint { files, tensors })
    }

    /// Whether a tensor of that name exists.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Names of all tensors.
    pub fn names(&self) -> Vec<&str> {
        self.tensors.keys().map(String::as_str).collect()
    }

    /// Loads one tensor, checks its shape, converts it to `dtype` on `device` (always a copy).
    pub fn load(
        &self,
        name: &str,
        shape: &[usize],
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let entry = self
            .tensors
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                path: self.describe_paths(),
                name: name.to_string(),
            })?;
        let file = &self.files[entry.file];
        if entry.shape != shape {
            return Err(ModelError::WrongShape {
                path: file.path.clone(),
                name: name.to_string(),
                expected: shape.to_vec(),
                found: entry.shape.clone(),
            });
        }
        debug_assert!(entry.start >= file.data_start);
        let view = TensorView::new(
            entry.dtype,
            entry.shape.clone(),
            &file.mmap[entry.start..entry.end],
        )
        .map_err(|e| ModelError::Safetensors {
            path: file.path.clone(),
            message: format!("tensor `{name}`: {e}"),
        })?;
        let t = view
            .load(&Device::Cpu)
            .map_err(|e| ModelError::Safetensors {
                path: file.path.clone(),
                message: format!("tensor `{name}`: {e}"),
            })?;
        match t.dtype() {
            DType::F32 | DType::BF16 | DType::F16 => {}
            other => {
                return Err(ModelError::Safetensors {
                    path: file.path.clone(),
                    message: format!(
                        "tensor `{name}` has dtype {other:?}; only f32/bf16/f16 are supported"
                    ),
                })
            }
        }
        Ok(t.to_dtype(dtype)?.to_device(device)?)
    }

    /// Loads every parameter of `cfg` (shape-checked). A tied checkpoint may still carry an
    /// `lm_head.weight`; it is ignored.
    pub fn load_all(
        &self,
        cfg: &ModelConfig,
        dtype: DType,
        device: &Device,
    ) -> Result<HashMap<String, Tensor>> {
        parameter_shapes(cfg)
            .into_iter()
            .map(|(name, shape)| Ok((name.clone(), self.load(&name, &shape, dtype, device)?)))
            .collect()
    }

    fn describe_paths(&self) -> PathBuf {
        match self.files.as_slice() {
            [one] => one.path.clone(),
            many => PathBuf::from(
                many.iter()
                    .map(|f| f.path.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
        }
    }
}

/// Checks that `tensors` holds exactly the parameters of `cfg` with the right shapes.
pub fn check_tensors(cfg: &ModelConfig, tensors: &HashMap<String, Tensor>) -> Result<()> {
    for (name, shape) in parameter_shapes(cfg) {
        let t = tensors
            .get(&name)
            .ok_or_else(|| ModelError::MissingTensor {
                path: PathBuf::from("<in memory>"),
                name: name.clone(),
            })?;
        if t.dims() != shape.as_slice() {
            return Err(ModelError::WrongShape {
                path: PathBuf::from("<in memory>"),
                name,
                expected: shape,
                found: t.dims().to_vec(),
            });
        }
    }
    Ok(())
}

/// For a file whose header does not validate, names the first tensor whose data lies past the
/// end of the file (the usual sign of a truncated download or copy).
fn describe_truncation(bytes: &[u8]) -> String {
    let Some(len_bytes) = bytes.get(..8) else {
        return format!(" (file is {} bytes: truncated)", bytes.len());
    };
    let header_len = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes")) as usize;
    let Some(header) = bytes.get(8..8usize.saturating_add(header_len)) else {
        return " (header extends past the end of the file: truncated)".into();
    };
    let Ok(serde_json::Value::Object(map)) = serde_json::from_slice::<serde_json::Value>(header)
    else {
        return String::new();
    };
    let data_len = bytes.len() - 8 - header_len;
    let mut beyond: Vec<(u64, &String)> = map
        .iter()
        .filter_map(|(name, info)| {
            let end = info.get("data_offsets")?.get(1)?.as_u64()?;
            (end as usize > data_len).then_some((end, name))
        })
        .collect();
    beyond.sort();
    match beyond.first() {
        Some((end, name)) => format!(
            " (tensor `{name}` ends at byte {end} of the data section but only {data_len} bytes are present: truncated)"
        ),
        None => String::new(),
    }
}
