//! Checkpoint files: the parameter list of a config, loading single or sharded safetensors
//! (validated, with errors naming file and tensor), seeded random initialisation and saving in
//! the Hugging Face layout.
//!
//! This is the only module of the crate that maps checkpoint files. A mapped file must not
//! change while it is open (a truncation would fault, a rewrite would be read torn), so only
//! directories that cascade itself published are mapped ([`Checkpoint::open_published`]:
//! snapshots and the trained reward model are written as `*.tmp`, fsynced, renamed and never
//! rewritten). A user's checkpoint ([`Checkpoint::open_dir`]) is read with positioned reads,
//! one tensor at a time, and its size and modification time are checked again after every
//! read: a file that changes while it is loaded is refused with an error, never used.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use candle_core::safetensors::Load;
use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use safetensors::tensor::{Metadata, TensorView};

use super::config::{parameter_shapes, ModelConfig};
use super::{ModelError, Result};

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

/// How a checkpoint file's bytes are reached.
enum FileBytes {
    /// A mapping of a published, immutable file.
    Mapped(memmap2::Mmap),
    /// A user's file, read on demand; `stamp` is its size and modification time at open.
    Read {
        file: File,
        stamp: (u64, Option<std::time::SystemTime>),
    },
}

struct MappedFile {
    path: PathBuf,
    bytes: FileBytes,
    /// Start of the data section (8 + header length).
    data_start: usize,
}

/// Size and modification time of an open file.
fn stamp(file: &File, path: &Path) -> Result<(u64, Option<std::time::SystemTime>)> {
    let meta = file.metadata().map_err(|e| ModelError::Io {
        path: path.to_path_buf(),
        source: e,
    })?;
    Ok((meta.len(), meta.modified().ok()))
}

impl MappedFile {
    /// The bytes `range` of the file: borrowed from a mapping, or read (and the file checked
    /// to be unchanged since it was opened).
    fn read(&self, range: std::ops::Range<usize>) -> Result<std::borrow::Cow<'_, [u8]>> {
        match &self.bytes {
            FileBytes::Mapped(mmap) => Ok(std::borrow::Cow::Borrowed(&mmap[range])),
            FileBytes::Read {
                file,
                stamp: at_open,
            } => {
                use std::os::unix::fs::FileExt;
                let io = |e| ModelError::Io {
                    path: self.path.clone(),
                    source: e,
                };
                let mut buf = vec![0u8; range.len()];
                file.read_exact_at(&mut buf, range.start as u64)
                    .map_err(io)?;
                if stamp(file, &self.path)? != *at_open {
                    return Err(ModelError::Safetensors {
                        path: self.path.clone(),
                        message: "the file changed while it was being loaded; load it again \
                                  once it is written completely"
                            .into(),
                    });
                }
                Ok(std::borrow::Cow::Owned(buf))
            }
        }
    }
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
    /// Opens the safetensors file(s) of a user's checkpoint directory (read, not mapped: the
    /// files may change while cascade runs).
    pub fn open_dir(dir: &Path) -> Result<Checkpoint> {
        Self::open_dir_with(dir, false)
    }

    /// Opens a checkpoint directory that cascade published (a snapshot, the trained reward
    /// model): immutable by the publication protocol, so its files are memory-mapped.
    pub fn open_published(dir: &Path) -> Result<Checkpoint> {
        Self::open_dir_with(dir, true)
    }

    fn open_dir_with(dir: &Path, mapped: bool) -> Result<Checkpoint> {
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        if single.exists() {
            return Checkpoint::open_files_with(&[single], mapped);
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
            let ckpt = Checkpoint::open_files_with(&files, mapped)?;
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

    /// Opens explicit safetensors files of a user's (read, not mapped).
    pub fn open_files(paths: &[PathBuf]) -> Result<Checkpoint> {
        Self::open_files_with(paths, false)
    }

    fn open_files_with(paths: &[PathBuf], mapped: bool) -> Result<Checkpoint> {
        let mut files = Vec::new();
        let mut tensors = HashMap::new();
        for (idx, path) in paths.iter().enumerate() {
            let io = |e| ModelError::Io {
                path: path.clone(),
                source: e,
            };
            let file = File::open(path).map_err(io)?;
            let st_err = |message: String| ModelError::Safetensors {
                path: path.clone(),
                message,
            };
            let (bytes, header_len, meta, file_len) = if mapped {
                // SAFETY: the mapping is read-only and the file is one cascade published: written
                // as `*.tmp`, fsynced, renamed and never rewritten (see the module docs), so it
                // does not change while mapped. Every access below is bounds-checked against the
                // parsed header before slicing.
                let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
                let (header_len, meta): (usize, Metadata) =
                    safetensors::SafeTensors::read_metadata(&mmap).map_err(|e| {
                        st_err(format!("bad header: {e}{}", describe_truncation(&mmap)))
                    })?;
                let len = mmap.len();
                (FileBytes::Mapped(mmap), header_len, meta, len)
            } else {
                let at_open = stamp(&file, path)?;
                let (header_len, meta) = read_header(&file, at_open.0).map_err(st_err)?;
                let len = at_open.0 as usize;
                (
                    FileBytes::Read {
                        file,
                        stamp: at_open,
                    },
                    header_len,
                    meta,
                    len,
                )
            };
            let data_start = 8 + header_len;
            let data_len = file_len.saturating_sub(data_start);
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
                bytes,
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
        let bytes = file.read(entry.start..entry.end)?;
        let view = TensorView::new(entry.dtype, entry.shape.clone(), &bytes).map_err(|e| {
            ModelError::Safetensors {
                path: file.path.clone(),
                message: format!("tensor `{name}`: {e}"),
            }
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

/// Reads and parses the header of a safetensors file of `len` bytes (positioned reads).
fn read_header(file: &File, len: u64) -> std::result::Result<(usize, Metadata), String> {
    use std::os::unix::fs::FileExt;
    let mut n = [0u8; 8];
    file.read_exact_at(&mut n, 0)
        .map_err(|e| format!("bad header: {e} (file is {len} bytes: truncated?)"))?;
    let header_len = u64::from_le_bytes(n);
    if header_len > 100 << 20 || 8 + header_len > len {
        return Err(format!(
            "bad header: {header_len} bytes announced in a file of {len} bytes (header extends past the end of the file: truncated?)"
        ));
    }
    let mut header = vec![0u8; header_len as usize];
    file.read_exact_at(&mut header, 8)
        .map_err(|e| format!("bad header: {e}"))?;
    let meta: Metadata = serde_json::from_slice(&header).map_err(|e| format!("bad header: {e}"))?;
    Ok((header_len as usize, meta))
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
