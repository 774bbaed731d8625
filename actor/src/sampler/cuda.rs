//! The CUDA sampler: `kernels/sampler.cu` compiled at run time with NVRTC and launched on
//! logits that stay in device memory (one block per row). Same keys and the same integer draw as
//! the CPU reference ([`super::cpu`]), so the tokens match it.
//!
//! With `cuda-kernels` alone, cudarc loads `libcuda` and `libnvrtc` lazily and *panics* when
//! they are missing, so every entry point checks [`driver_available`] / [`nvrtc_available`]
//! first and returns [`SamplerError::NoDriver`] or [`SamplerError::Compile`] instead. With
//! `cuda`, both libraries are linked (see [`driver_available`]).

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, CudaView, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions, Ptx};

use super::error::{Result, SamplerError};
use super::kernels::{NVRTC_OPTIONS, SAMPLER_CU, THREADS};
use super::launch::{flat_keys, philox_kat_input, KernelArgs};
use super::params::{SampleKey, Sampled, SamplingParams};
use super::Sampler;

/// Whether the CUDA driver library (`libcuda.so`) can be loaded.
#[cfg(not(feature = "cuda"))]
pub fn driver_available() -> bool {
    // SAFETY: `is_culib_present` only tries `dlopen` on the driver's library names and drops
    // the handle; it has no precondition. Loading runs the library's initialisers, which is
    // what any later CUDA call would do anyway.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether NVRTC (`libnvrtc.so.13`) can be loaded.
#[cfg(not(feature = "cuda"))]
pub fn nvrtc_available() -> bool {
    // SAFETY: as for `driver_available`: a `dlopen` attempt with no precondition.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Whether the CUDA driver library can be used: always, with the `cuda` feature. candle's CUDA
/// backend makes cudarc link `libcuda` and `libnvrtc` at build time (its `dynamic-linking`,
/// which replaces the lazy loading of `cuda-kernels` alone), so a binary built with it does
/// not start without them; the dynamic loader names the missing library.
#[cfg(feature = "cuda")]
pub fn driver_available() -> bool {
    true
}

/// Whether NVRTC can be used: always, with the `cuda` feature (linked, see
/// [`driver_available`]).
#[cfg(feature = "cuda")]
pub fn nvrtc_available() -> bool {
    true
}

/// Compiles one kernel source to PTX with the sampler's NVRTC options.
pub fn compile(name: &'static str, source: &str) -> Result<Ptx> {
    if !nvrtc_available() {
        return Err(SamplerError::Compile {
            kernel: name,
            log: "libnvrtc.so.13 not found (run scripts/setup-nvrtc.sh and put its lib dir on \
                  LD_LIBRARY_PATH)"
                .into(),
        });
    }
    let opts = CompileOptions {
        options: NVRTC_OPTIONS.iter().map(|s| s.to_string()).collect(),
        name: Some(name.to_string()),
        ..Default::default()
    };
    compile_ptx_with_opts(source, opts).map_err(|e| SamplerError::Compile {
        kernel: name,
        log: match e {
            CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => other.to_string(),
        },
    })
}

/// Sampler kernels loaded on one CUDA stream.
pub struct CudaSampler {
    stream: Arc<CudaStream>,
    sample_rows: CudaFunction,
    philox_kat: CudaFunction,
}

impl std::fmt::Debug for CudaSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaSampler")
            .field("ordinal", &self.stream.context().ordinal())
            .finish()
    }
}

impl CudaSampler {
    /// Creates a context on GPU `ordinal` and loads the kernels on its default stream.
    pub fn new(ordinal: usize) -> Result<Self> {
        if !driver_available() {
            return Err(SamplerError::NoDriver);
        }
        let ctx = CudaContext::new(ordinal)?;
        Self::on_stream(ctx.default_stream())
    }

    /// Loads the kernels for an existing stream (e.g. the one candle's device uses, so that
    /// sampling is ordered after the forward pass that wrote the logits).
    pub fn on_stream(stream: Arc<CudaStream>) -> Result<Self> {
        if !driver_available() {
            return Err(SamplerError::NoDriver);
        }
        let ptx = compile("sampler.cu", SAMPLER_CU)?;
        let module = stream.context().load_module(ptx)?;
        Ok(Self {
            sample_rows: module.load_function("sample_rows")?,
            philox_kat: module.load_function("philox_kat")?,
            stream,
        })
    }

    /// The stream the kernels run on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Copies sample keys to the device, 3 × u64 per row (seed, stream, position).
    pub fn upload_keys(&self, keys: &[SampleKey]) -> Result<CudaSlice<u64>> {
        Ok(self.stream.clone_htod(&flat_keys(keys))?)
    }

    /// Enqueues the sampler on the stream without waiting: `tokens[r]` and `logprobs[r]` get
    /// row `r`'s draw (token `u32::MAX` and a NaN log-prob for a row with NaN/`+inf` logits or
    /// no finite logit). `keys` comes from [`Self::upload_keys`].
    pub fn launch(
        &self,
        logits: &CudaView<'_, f32>,
        vocab: usize,
        params: &SamplingParams,
        keys: &CudaSlice<u64>,
        tokens: &mut CudaSlice<u32>,
        logprobs: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let args = KernelArgs::new(params, vocab)?;
        let rows = keys.len() / 3;
        if logits.len() != rows * vocab || rows * 3 != keys.len() {
            return Err(SamplerError::Shape {
                len: logits.len(),
                rows,
                vocab,
            });
        }
        if tokens.len() < rows || logprobs.len() < rows {
            return Err(SamplerError::Shape {
                len: tokens.len().min(logprobs.len()),
                rows,
                vocab,
            });
        }
        if rows == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = self.stream.launch_builder(&self.sample_rows);
        launch
            .arg(logits)
            .arg(&args.vocab)
            .arg(&args.temperature)
            .arg(&args.inv_t)
            .arg(&args.greedy)
            .arg(&args.top_k)
            .arg(&args.top_p)
            .arg(keys)
            .arg(tokens)
            .arg(logprobs);
        // SAFETY: the argument list matches `sample_rows`'s signature in sampler.cu (pointer,
        // u32, f32, f32, i32, u32, f32, pointer, pointer, pointer); the buffers were checked
        // above to hold `rows * vocab` logits, `3 * rows` keys and `rows` outputs, and the
        // kernel reads and writes only those (block r touches row r and outputs r).
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }

    /// Samples one token per row of the device-resident `logits` and copies the results back
    /// (`2 × 4` bytes per row: the logits never leave the device).
    pub fn sample_device(
        &self,
        logits: &CudaView<'_, f32>,
        vocab: usize,
        params: &SamplingParams,
        keys: &[SampleKey],
    ) -> Result<Vec<Sampled>> {
        let keys_dev = self.upload_keys(keys)?;
        let mut tokens = self.stream.alloc_zeros::<u32>(keys.len())?;
        let mut logprobs = self.stream.alloc_zeros::<f32>(keys.len())?;
        self.launch(logits, vocab, params, &keys_dev, &mut tokens, &mut logprobs)?;
        let tokens = self.stream.clone_dtoh(&tokens)?;
        let logprobs = self.stream.clone_dtoh(&logprobs)?;
        tokens
            .into_iter()
            .zip(logprobs)
            .enumerate()
            .map(|(row, (token, logprob))| {
                if token == u32::MAX {
                    Err(SamplerError::NonFinite { row })
                } else {
                    Ok(Sampled { token, logprob })
                }
            })
            .collect()
    }

    /// Word 0 of Philox4x32-10 computed on the device for each key (checks the device RNG
    /// against [`super::philox::uniform_bits`]).
    pub fn philox_bits(&self, keys: &[SampleKey]) -> Result<Vec<u32>> {
        let input = self.stream.clone_htod(&philox_kat_input(keys))?;
        let mut out = self.stream.alloc_zeros::<u32>(keys.len())?;
        let n = keys.len() as i32;
        let mut launch = self.stream.launch_builder(&self.philox_kat);
        launch.arg(&input).arg(&mut out).arg(&n);
        // SAFETY: matches `philox_kat(const u32*, u32*, int)`; `input` holds 6 words and `out`
        // one word per key, and threads with index >= n return without touching memory.
        unsafe { launch.launch(LaunchConfig::for_num_elems(n.max(1) as u32)) }?;
        Ok(self.stream.clone_dtoh(&out)?)
    }
}

impl Sampler for CudaSampler {
    type Logits = CudaSlice<f32>;

    fn sample(
        &self,
        logits: &CudaSlice<f32>,
        vocab: usize,
        params: &SamplingParams,
        keys: &[SampleKey],
    ) -> Result<Vec<Sampled>> {
        self.sample_device(&logits.as_view(), vocab, params, keys)
    }
}
