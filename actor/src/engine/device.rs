//! Sampling where the logits are (feature `cuda`): when the model runs on a CUDA device, the
//! engine launches the CUDA sampler ([`crate::sampler::cuda`]) on the logits tensor's own
//! device buffer, on candle's stream (so it is ordered after the forward pass that wrote them),
//! and copies back only one token and one log-prob per row instead of `rows × vocab` logits.
//! Same keys and the same integer draw as the CPU sampler, so the tokens do not depend on
//! where they were drawn.

use candle_core::{DType, Device, Storage, Tensor};

use crate::error::{ActorError, Result};
use crate::sampler::cuda::CudaSampler;
use crate::sampler::{SampleKey, Sampled, SamplingParams};

/// The CUDA sampler bound to the stream of one candle CUDA device.
pub(super) struct DeviceSampler {
    sampler: CudaSampler,
}

impl std::fmt::Debug for DeviceSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceSampler")
            .field("sampler", &self.sampler)
            .finish()
    }
}

impl DeviceSampler {
    /// The sampler kernels on `device`'s stream; `None` for a CPU device. An error when the
    /// kernels cannot be compiled or loaded (no NVRTC, no driver).
    pub(super) fn for_device(device: &Device) -> Result<Option<DeviceSampler>> {
        let Device::Cuda(dev) = device else {
            return Ok(None);
        };
        let sampler = CudaSampler::on_stream(dev.cuda_stream())?;
        Ok(Some(DeviceSampler { sampler }))
    }

    /// Samples rows `idx` of `logits` (`[rows, vocab]`, on this sampler's device), all rows
    /// when `idx` is `None`, one key per sampled row.
    pub(super) fn sample(
        &self,
        logits: &Tensor,
        idx: Option<&[usize]>,
        params: &SamplingParams,
        keys: &[SampleKey],
    ) -> Result<Vec<Sampled>> {
        let rows = match idx {
            None => logits.clone(),
            Some(idx) => {
                let ids: Vec<u32> = idx.iter().map(|&i| i as u32).collect();
                let ids = Tensor::from_vec(ids, idx.len(), logits.device())?;
                logits.index_select(&ids, 0)?
            }
        };
        let rows = rows.to_dtype(DType::F32)?.contiguous()?;
        let (n, vocab) = rows.dims2()?;
        if n != keys.len() {
            return Err(ActorError::Invalid(format!(
                "device sampler: {n} rows of logits for {} keys",
                keys.len()
            )));
        }
        let (storage, layout) = rows.storage_and_layout();
        let Storage::Cuda(storage) = &*storage else {
            return Err(ActorError::Invalid(
                "device sampler: logits are not on a CUDA device".into(),
            ));
        };
        let start = layout.start_offset();
        let slice = storage.as_cuda_slice::<f32>()?;
        let view = slice.slice(start..start + n * vocab);
        Ok(self.sampler.sample_device(&view, vocab, params, keys)?)
    }
}
