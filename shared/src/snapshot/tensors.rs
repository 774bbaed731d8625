//! Writing and reading safetensors files.
//!
//! The writer streams tensors straight into a buffered file while computing the file's CRC-32C
//! ([`DigestWriter`]), so a snapshot's checksum manifest costs no second read, and fsyncs the
//! file before returning.
//! Reading goes through candle (`candle_core::safetensors::load`); only the header's
//! `__metadata__` is parsed here.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use half::{bf16, f16};
use serde_json::{json, Map, Value};

use super::durable::{DigestWriter, FileDigest};
use super::error::{Result, SnapshotError};

/// The safetensors dtype name of a candle dtype.
fn dtype_name(dtype: DType, path: &Path) -> Result<&'static str> {
    Ok(match dtype {
        DType::F32 => "F32",
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        DType::F64 => "F64",
        DType::U8 => "U8",
        DType::U32 => "U32",
        DType::I64 => "I64",
        other => {
            return Err(SnapshotError::Safetensors {
                path: path.to_path_buf(),
                reason: format!("dtype {other:?} cannot be written to safetensors"),
            })
        }
    })
}

/// Elements converted per chunk: bounds the temporary copy of a large tensor.
const CHUNK_ELEMS: usize = 1 << 20;

/// Writes the little-endian bytes of a (CPU, contiguous, 1-D) tensor.
fn write_tensor_bytes(out: &mut impl Write, flat: &Tensor, path: &Path) -> Result<()> {
    let n = flat.elem_count();
    let mut buf: Vec<u8> = Vec::new();
    let mut start = 0;
    while start < n {
        let len = CHUNK_ELEMS.min(n - start);
        let chunk = flat.narrow(0, start, len)?;
        buf.clear();
        macro_rules! put {
            ($t:ty) => {
                for x in chunk.to_vec1::<$t>()? {
                    buf.extend_from_slice(&x.to_le_bytes());
                }
            };
        }
        match flat.dtype() {
            DType::F32 => put!(f32),
            DType::F16 => put!(f16),
            DType::BF16 => put!(bf16),
            DType::F64 => put!(f64),
            DType::U8 => put!(u8),
            DType::U32 => put!(u32),
            DType::I64 => put!(i64),
            other => {
                return Err(SnapshotError::Safetensors {
                    path: path.to_path_buf(),
                    reason: format!("dtype {other:?} cannot be written"),
                })
            }
        }
        out.write_all(&buf)
            .map_err(|e| SnapshotError::io(path, e))?;
        start += len;
    }
    Ok(())
}

/// Writes `tensors` (any device; copied to the CPU one at a time) and `metadata` as a
/// safetensors file at `path`, fsyncs it, and returns its size and CRC-32C. Tensor order in the
/// file follows `tensors`; the header lists them by name, as the format requires nothing else.
pub fn write_safetensors(
    path: &Path,
    tensors: &[(String, Tensor)],
    metadata: &BTreeMap<String, String>,
) -> Result<FileDigest> {
    let io = |e: std::io::Error| SnapshotError::io(path, e);
    let mut header = Map::new();
    if !metadata.is_empty() {
        header.insert("__metadata__".into(), json!(metadata));
    }
    let mut offset = 0usize;
    for (name, t) in tensors {
        let len = t.elem_count() * t.dtype().size_in_bytes();
        header.insert(
            name.clone(),
            json!({
                "dtype": dtype_name(t.dtype(), path)?,
                "shape": t.dims(),
                "data_offsets": [offset, offset + len],
            }),
        );
        offset += len;
    }
    let mut header_bytes =
        serde_json::to_vec(&Value::Object(header)).map_err(|e| SnapshotError::json(path, e))?;
    // Data starts 8-byte aligned, as safetensors' own writer does.
    header_bytes.resize(header_bytes.len().next_multiple_of(8), b' ');

    let file = File::create(path).map_err(io)?;
    let mut out = DigestWriter::new(BufWriter::with_capacity(1 << 20, file));
    out.write_all(&(header_bytes.len() as u64).to_le_bytes())
        .map_err(io)?;
    out.write_all(&header_bytes).map_err(io)?;
    for (_, t) in tensors {
        let flat = t.to_device(&Device::Cpu)?.flatten_all()?;
        write_tensor_bytes(&mut out, &flat, path)?;
    }
    let digest = out.digest();
    let file = out
        .into_inner()
        .into_inner()
        .map_err(|e| SnapshotError::io(path, e.into_error()))?;
    file.sync_all().map_err(io)?;
    Ok(digest)
}

/// Reads the `__metadata__` map of a safetensors file (empty if it has none).
pub fn read_safetensors_metadata(path: &Path) -> Result<BTreeMap<String, String>> {
    let io = |e: std::io::Error| SnapshotError::io(path, e);
    let bad = |reason: String| SnapshotError::Safetensors {
        path: path.to_path_buf(),
        reason,
    };
    let mut file = File::open(path).map_err(io)?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(io)?;
    let len = u64::from_le_bytes(len);
    if len > 100 << 20 {
        return Err(bad(format!("header of {len} bytes")));
    }
    let mut header = vec![0u8; len as usize];
    file.read_exact(&mut header).map_err(io)?;
    let header: Value =
        serde_json::from_slice(&header).map_err(|e| SnapshotError::json(path, e))?;
    let Some(meta) = header.get("__metadata__") else {
        return Ok(BTreeMap::new());
    };
    serde_json::from_value(meta.clone()).map_err(|e| bad(format!("__metadata__: {e}")))
}

/// Loads every tensor of a safetensors file onto `device`.
pub fn read_safetensors(path: &Path, device: &Device) -> Result<BTreeMap<String, Tensor>> {
    let map =
        candle_core::safetensors::load(path, device).map_err(|e| SnapshotError::Safetensors {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    Ok(map.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_with_metadata_and_checksum() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.safetensors");
        let d = Device::Cpu;
        let tensors = vec![
            (
                "b".to_string(),
                Tensor::new(&[[1f32, 2.0], [3.0, 4.0]], &d).unwrap(),
            ),
            (
                "a".to_string(),
                Tensor::new(&[1f32, -2.0, 3.5], &d)
                    .unwrap()
                    .to_dtype(DType::BF16)
                    .unwrap(),
            ),
            ("n".to_string(), Tensor::new(&[7i64], &d).unwrap()),
        ];
        let meta = BTreeMap::from([("step".to_string(), "3".to_string())]);
        let digest = write_safetensors(&path, &tensors, &meta).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(digest.bytes, bytes.len() as u64);
        assert_eq!(digest.crc32c, crc32c::crc32c(&bytes));
        assert_eq!(read_safetensors_metadata(&path).unwrap(), meta);
        let back = read_safetensors(&path, &d).unwrap();
        assert_eq!(back.len(), 3);
        for (name, t) in &tensors {
            let b = &back[name];
            assert_eq!(b.dtype(), t.dtype());
            assert_eq!(b.dims(), t.dims());
            let diff = (b.to_dtype(DType::F64).unwrap() - t.to_dtype(DType::F64).unwrap())
                .unwrap()
                .abs()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f64>()
                .unwrap();
            assert_eq!(diff, 0.0, "{name}");
        }
    }
}
