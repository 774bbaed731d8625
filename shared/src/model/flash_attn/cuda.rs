//! The CUDA kernels of the fused attention (`kernels/flash_attn.cu`, feature `cuda-kernels`):
//! compiled once per process with NVRTC, launched on cudarc buffers. The candle ops in
//! [`super::op`] (feature `cuda`) call these with the device buffers of candle's tensors, on
//! candle's stream.
//!
//! With `cuda-kernels` alone, cudarc loads `libnvrtc` lazily and *panics* when it is missing, so
//! [`ptx`] checks [`nvrtc_available`] first and returns an error instead.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

use cudarc::driver::{
    CudaFunction, CudaStream, CudaView, CudaViewMut, DeviceRepr, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions};

use super::kernels::{
    mma_source, Kernel, KernelDtype, Tiles, FLASH_ATTN_CU, MMA_MIN_MAJOR, MMA_NVRTC_OPTIONS,
    NVRTC_OPTIONS, THREADS,
};

/// Whether NVRTC (`libnvrtc.so.13`) can be loaded.
#[cfg(not(feature = "cuda"))]
pub fn nvrtc_available() -> bool {
    // SAFETY: `is_culib_present` only tries `dlopen` on NVRTC's library names and drops the
    // handle; it has no precondition.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Whether NVRTC can be used: always with the `cuda` feature, where candle's CUDA backend links
/// it at build time (a binary without it does not start).
#[cfg(feature = "cuda")]
pub fn nvrtc_available() -> bool {
    true
}

/// Compiles `flash_attn.cu` to PTX text; the error is NVRTC's log.
pub fn compile_ptx() -> Result<String, String> {
    compile_source(FLASH_ATTN_CU, "flash_attn.cu", NVRTC_OPTIONS)
}

/// Compiles CUDA C `source` (named `name` in NVRTC's messages) to PTX text with `options`; the
/// error is NVRTC's log, or why NVRTC could not be loaded.
pub(crate) fn compile_source(source: &str, name: &str, options: &[&str]) -> Result<String, String> {
    if !nvrtc_available() {
        return Err(
            "libnvrtc.so.13 not found (run scripts/setup-nvrtc.sh and put its lib dir on \
                    LD_LIBRARY_PATH)"
                .into(),
        );
    }
    let opts = CompileOptions {
        options: options.iter().map(|s| s.to_string()).collect(),
        name: Some(name.into()),
        ..Default::default()
    };
    match compile_ptx_with_opts(source, opts) {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(CompileError::CompileError { log, .. }) => Err(log.to_string_lossy().into_owned()),
        Err(other) => Err(other.to_string()),
    }
}

/// The PTX of `flash_attn.cu`, compiled on first use and kept for the process.
pub fn ptx() -> candle_core::Result<&'static str> {
    static PTX: OnceLock<Result<String, String>> = OnceLock::new();
    match PTX.get_or_init(compile_ptx) {
        Ok(ptx) => Ok(ptx),
        Err(log) => candle_core::bail!("flash-attn: flash_attn.cu does not compile: {log}"),
    }
}

/// Compiles the tensor-core kernels (`flash_attn.cu` then `flash_attn_mma.cu`, for
/// `compute_80`) to PTX text; the error is NVRTC's log.
pub fn compile_mma_ptx() -> Result<String, String> {
    compile_source(&mma_source(), "flash_attn_mma.cu", MMA_NVRTC_OPTIONS)
}

/// The PTX of the tensor-core kernels, compiled on first use and kept for the process.
pub fn mma_ptx() -> candle_core::Result<&'static str> {
    static PTX: OnceLock<Result<String, String>> = OnceLock::new();
    match PTX.get_or_init(compile_mma_ptx) {
        Ok(ptx) => Ok(ptx),
        Err(log) => candle_core::bail!("flash-attn: flash_attn_mma.cu does not compile: {log}"),
    }
}

/// candle's cache key for the loaded tensor-core module ([`mma_ptx`]); the paged prefill
/// kernel lives there too.
pub const MMA_MODULE: &str = "cascade_flash_attn_mma";

/// 0: not decided yet (read `CASCADE_FLASH_ATTN_TENSOR_CORES`), 1: on, 2: off.
static TENSOR_CORES: AtomicU8 = AtomicU8::new(0);

/// Turns the tensor-core kernels on or off for this process (on by default; the environment
/// variable `CASCADE_FLASH_ATTN_TENSOR_CORES=0` turns them off at start). Off, bf16 runs on
/// the FMA kernels of `flash_attn.cu`, as on GPUs older than compute capability 8.0.
pub fn set_tensor_cores(on: bool) {
    TENSOR_CORES.store(if on { 1 } else { 2 }, Ordering::Relaxed);
}

/// Whether the tensor-core kernels may be used (see [`set_tensor_cores`]).
pub fn tensor_cores_enabled() -> bool {
    match TENSOR_CORES.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let on = std::env::var("CASCADE_FLASH_ATTN_TENSOR_CORES").map_or(true, |v| v != "0");
            set_tensor_cores(on);
            on
        }
    }
}

/// Whether a call of `dtype` on a device of compute capability `major` runs on the
/// tensor-core kernels: bf16, compute capability 8.0 or newer, and [`tensor_cores_enabled`].
pub fn uses_tensor_cores(dtype: KernelDtype, major: i32) -> bool {
    dtype == KernelDtype::Bf16 && major >= MMA_MIN_MAJOR && tensor_cores_enabled()
}

/// The shape and scale of one call: q/o/dO `(b, heads, t, d)`, k/v `(b, kv_heads, t, d)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CallDims {
    /// Batch rows.
    pub b: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (divides `heads`).
    pub kv_heads: usize,
    /// Sequence length.
    pub t: usize,
    /// Head dimension (at most [`super::kernels::MAX_HEAD_DIM`]).
    pub d: usize,
    /// Multiplier of the scores.
    pub scale: f32,
}

impl CallDims {
    /// The tile variant of the FMA kernels for this head dimension; an error above the
    /// kernels' bound.
    pub fn tiles(&self) -> candle_core::Result<Tiles> {
        self.tiles_of(false)
    }

    /// The tile variant for this head dimension, of the tensor-core kernels when
    /// `tensor_cores`; an error above the kernels' bound.
    pub fn tiles_of(&self, tensor_cores: bool) -> candle_core::Result<Tiles> {
        let tiles = if tensor_cores {
            Tiles::tensor_cores_for_head_dim(self.d)
        } else {
            Tiles::for_head_dim(self.d)
        };
        match tiles {
            Some(t) => Ok(t),
            None => candle_core::bail!(
                "flash-attn: head dim {} is not supported by the CUDA kernels (1..={})",
                self.d,
                super::kernels::MAX_HEAD_DIM
            ),
        }
    }

    fn q_len(&self) -> usize {
        self.b * self.heads * self.t * self.d
    }

    fn kv_len(&self) -> usize {
        self.b * self.kv_heads * self.t * self.d
    }

    fn rows(&self) -> usize {
        self.b * self.heads * self.t
    }

    /// `(heads, kv_heads, t, d)` as the kernels' `unsigned int` arguments.
    fn args(&self) -> candle_core::Result<[u32; 4]> {
        let fit = |x: usize, what: &str| {
            u32::try_from(x).map_err(|_| {
                candle_core::Error::Msg(format!("flash-attn: {what} {x} does not fit in u32"))
            })
        };
        if self.q_len() > u32::MAX as usize * 64 {
            // Offsets are 64-bit in the kernels; this only guards absurd shapes.
            candle_core::bail!("flash-attn: {} query elements is too many", self.q_len());
        }
        Ok([
            fit(self.heads, "heads")?,
            fit(self.kv_heads, "kv heads")?,
            fit(self.t, "sequence length")?,
            fit(self.d, "head dim")?,
        ])
    }
}

/// Segments on the device, from [`super::Segments::device_arrays`].
#[derive(Debug)]
pub struct DeviceSegments<'a> {
    /// `batch + 1` offsets into `segs` (in pairs).
    pub seg_off: CudaView<'a, u32>,
    /// `(start, end)` pairs.
    pub segs: CudaView<'a, u32>,
}

fn check_len(what: &str, got: usize, want: usize) -> candle_core::Result<()> {
    if got != want {
        candle_core::bail!("flash-attn: {what} holds {got} elements, the shape needs {want}");
    }
    Ok(())
}

/// `tiles` must be a variant for `dims.d`.
fn check_tiles(dims: &CallDims, tiles: Tiles) -> candle_core::Result<()> {
    let want = dims.tiles_of(tiles.tensor_cores)?;
    if want != tiles {
        candle_core::bail!(
            "flash-attn: tiles {tiles:?} do not serve head dim {} ({want:?} do)",
            dims.d
        );
    }
    Ok(())
}

fn config(blocks: usize) -> candle_core::Result<LaunchConfig> {
    let blocks = u32::try_from(blocks)
        .ok()
        .filter(|&b| b < i32::MAX as u32)
        .ok_or_else(|| candle_core::Error::Msg(format!("flash-attn: grid of {blocks} blocks")))?;
    Ok(LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    })
}

fn wrap(e: cudarc::driver::DriverError) -> candle_core::Error {
    candle_core::Error::wrap(e)
}

/// Enqueues the forward: `out` (like q) and `lse` (`b * heads * t` f32) are written in full.
/// `func` is the [`Kernel::Forward`] entry of the element type `T` and of `tiles` (from
/// [`CallDims::tiles_of`]).
#[allow(clippy::too_many_arguments)]
pub fn launch_forward<T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    (func, tiles): (&CudaFunction, Tiles),
    dims: &CallDims,
    (q, k, v): (&CudaView<'_, T>, &CudaView<'_, T>, &CudaView<'_, T>),
    segments: &DeviceSegments<'_>,
    out: &mut CudaViewMut<'_, T>,
    lse: &mut CudaViewMut<'_, f32>,
) -> candle_core::Result<()> {
    check_tiles(dims, tiles)?;
    let [heads, kv_heads, t, d] = dims.args()?;
    check_len("q", q.len(), dims.q_len())?;
    check_len("k", k.len(), dims.kv_len())?;
    check_len("v", v.len(), dims.kv_len())?;
    check_len("out", out.len(), dims.q_len())?;
    check_len("lse", lse.len(), dims.rows())?;
    check_len("seg_off", segments.seg_off.len(), dims.b + 1)?;
    if dims.q_len() == 0 {
        return Ok(());
    }
    let blocks = tiles.blocks_per_head(Kernel::Forward, dims.t) as u32;
    let cfg = config(tiles.grid(Kernel::Forward, dims.b, dims.heads, dims.kv_heads, dims.t))?;
    let mut launch = stream.launch_builder(func);
    launch
        .arg(q)
        .arg(k)
        .arg(v)
        .arg(&segments.seg_off)
        .arg(&segments.segs)
        .arg(out)
        .arg(lse)
        .arg(&heads)
        .arg(&kv_heads)
        .arg(&t)
        .arg(&d)
        .arg(&dims.scale)
        .arg(&blocks);
    // SAFETY: the arguments match `fa_fwd_*(const T*, const T*, const T*, const unsigned*,
    // const unsigned*, T*, float*, unsigned x4, float, unsigned)`; every buffer was checked to
    // hold what the shape needs, the segments were validated on the host (sorted, disjoint,
    // within t), and each block writes only its own rows of `out` and `lse`.
    unsafe { launch.launch(cfg) }.map_err(wrap)?;
    Ok(())
}

/// Inputs of the backward that have the query shape: `q`, the forward's `O` and `dO`.
pub type QueryInputs<'a, 'b, T> = (
    &'a CudaView<'b, T>,
    &'a CudaView<'b, T>,
    &'a CudaView<'b, T>,
);

/// Enqueues the backward: `dq` (like q), `dk`, `dv` (like k) are written in full; `delta`
/// (`b * heads * t` f32) is scratch. `dq_func` and `dkdv_func` are the [`Kernel::Dq`] and
/// [`Kernel::DkDv`] entries of `T` and `tiles`; `lse` is the forward's.
#[allow(clippy::too_many_arguments)]
pub fn launch_backward<T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    (dq_func, dkdv_func, tiles): (&CudaFunction, &CudaFunction, Tiles),
    dims: &CallDims,
    (q, o, d_o): QueryInputs<'_, '_, T>,
    (k, v): (&CudaView<'_, T>, &CudaView<'_, T>),
    lse: &CudaView<'_, f32>,
    segments: &DeviceSegments<'_>,
    (dq, dk, dv): (
        &mut CudaViewMut<'_, T>,
        &mut CudaViewMut<'_, T>,
        &mut CudaViewMut<'_, T>,
    ),
    delta: &mut CudaViewMut<'_, f32>,
) -> candle_core::Result<()> {
    check_tiles(dims, tiles)?;
    let [heads, kv_heads, t, d] = dims.args()?;
    for (what, len) in [
        ("q", q.len()),
        ("O", o.len()),
        ("dO", d_o.len()),
        ("dq", dq.len()),
    ] {
        check_len(what, len, dims.q_len())?;
    }
    for (what, len) in [
        ("k", k.len()),
        ("v", v.len()),
        ("dk", dk.len()),
        ("dv", dv.len()),
    ] {
        check_len(what, len, dims.kv_len())?;
    }
    check_len("lse", lse.len(), dims.rows())?;
    check_len("delta", delta.len(), dims.rows())?;
    check_len("seg_off", segments.seg_off.len(), dims.b + 1)?;
    if dims.q_len() == 0 {
        return Ok(());
    }
    let blocks = tiles.blocks_per_head(Kernel::Dq, dims.t) as u32;
    let cfg = config(tiles.grid(Kernel::Dq, dims.b, dims.heads, dims.kv_heads, dims.t))?;
    let mut launch = stream.launch_builder(dq_func);
    launch
        .arg(q)
        .arg(k)
        .arg(v)
        .arg(o)
        .arg(d_o)
        .arg(lse)
        .arg(&segments.seg_off)
        .arg(&segments.segs)
        .arg(dq)
        .arg(&mut *delta)
        .arg(&heads)
        .arg(&kv_heads)
        .arg(&t)
        .arg(&d)
        .arg(&dims.scale)
        .arg(&blocks);
    // SAFETY: matches `fa_dq_*(const T* x5, const float*, const unsigned* x2, T*, float*,
    // unsigned x4, float, unsigned)`; buffer sizes checked above; each block writes only its
    // own rows of `dq` and `delta`.
    unsafe { launch.launch(cfg) }.map_err(wrap)?;

    let blocks = tiles.blocks_per_head(Kernel::DkDv, dims.t) as u32;
    let cfg = config(tiles.grid(Kernel::DkDv, dims.b, dims.heads, dims.kv_heads, dims.t))?;
    let delta = delta.as_view();
    let mut launch = stream.launch_builder(dkdv_func);
    launch
        .arg(q)
        .arg(k)
        .arg(v)
        .arg(d_o)
        .arg(lse)
        .arg(&delta)
        .arg(&segments.seg_off)
        .arg(&segments.segs)
        .arg(dk)
        .arg(dv)
        .arg(&heads)
        .arg(&kv_heads)
        .arg(&t)
        .arg(&d)
        .arg(&dims.scale)
        .arg(&blocks);
    // SAFETY: matches `fa_dkdv_*(const T* x4, const float* x2, const unsigned* x2, T*, T*,
    // unsigned x4, float, unsigned)`; sizes checked above; `delta` was written by the dQ
    // kernel earlier on the same stream; each block writes only its own keys of `dk`/`dv`.
    unsafe { launch.launch(cfg) }.map_err(wrap)?;
    Ok(())
}
