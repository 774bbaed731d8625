//! The CUDA kernel of the paged decode attention (`kernels/paged_attn.cu`, feature
//! `cuda-kernels`): compiled once per process with NVRTC, launched on cudarc buffers. The candle
//! op ([`super::PagedAttention`], feature `cuda`) calls `forward` (feature `cuda`) with the
//! device buffers of candle's tensors and a [`DeviceTable`], on candle's stream.
//!
//! A call whose unsplit grid is too small for the GPU splits each row over the token axis
//! (flash-decoding, [`kernels::split_plan`] from the device's SM count, queried once per device):
//! pass 1 writes each split's partial softmax state to an f32 workspace allocated per call, pass 2
//! (`paged_combine_*`) combines the splits in order and writes the output.
//!
//! With `cuda-kernels` alone, cudarc loads `libnvrtc` lazily and *panics* when it is missing, so
//! [`ptx`] checks [`nvrtc_available`] first and returns an error instead.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DeviceRepr, LaunchConfig,
    PushKernelArg,
};

use super::kernels::{self, SplitPlan, NVRTC_OPTIONS, PAGED_ATTN_CU, THREADS};
use super::PageTable;
pub use crate::model::flash_attn::cuda::nvrtc_available;

/// Compiles `paged_attn.cu` to PTX text; the error is NVRTC's log.
pub fn compile_ptx() -> Result<String, String> {
    crate::model::flash_attn::cuda::compile_source(PAGED_ATTN_CU, "paged_attn.cu", NVRTC_OPTIONS)
}

/// The PTX of `paged_attn.cu`, compiled on first use and kept for the process.
pub fn ptx() -> candle_core::Result<&'static str> {
    static PTX: OnceLock<Result<String, String>> = OnceLock::new();
    match PTX.get_or_init(compile_ptx) {
        Ok(ptx) => Ok(ptx),
        Err(log) => candle_core::bail!("paged attention: paged_attn.cu does not compile: {log}"),
    }
}

/// A [`PageTable`] on the device: `blocks` (`rows × width`) and `lens` (`rows`), plus what the
/// launcher checks against the pools. Only made from a validated host table, so that the kernel
/// reads pool rows below [`DeviceTable::rows_needed`] only.
#[derive(Debug)]
pub struct DeviceTable {
    blocks: CudaSlice<u32>,
    lens: CudaSlice<u32>,
    /// For a prefill-shaped table ([`kernels::chunk_shaped`]): its runs of at most
    /// [`kernels::CHUNK_ROWS`] rows as `(first row, rows)` pairs, and their count.
    runs: Option<(CudaSlice<u32>, usize)>,
    rows: usize,
    width: usize,
    rows_needed: usize,
    max_len: usize,
}

impl DeviceTable {
    /// The host arrays of `table` (each at least one element: cudarc does not allocate empty
    /// buffers) and its shape.
    fn host_arrays(table: &PageTable) -> (Vec<u32>, Vec<u32>) {
        let nonempty = |v: &[u32]| if v.is_empty() { vec![0] } else { v.to_vec() };
        (nonempty(table.blocks()), nonempty(table.lens()))
    }

    /// The `(first row, rows)` pairs of a prefill-shaped table, else `None`.
    fn host_runs(table: &PageTable) -> Option<Vec<u32>> {
        let runs = table.runs(kernels::CHUNK_ROWS);
        kernels::chunk_shaped(table.rows(), runs.len()).then(|| {
            runs.iter()
                .flat_map(|&(first, n)| [first as u32, n as u32])
                .collect()
        })
    }

    fn from_slices(
        table: &PageTable,
        blocks: CudaSlice<u32>,
        lens: CudaSlice<u32>,
        runs: Option<CudaSlice<u32>>,
    ) -> Self {
        DeviceTable {
            blocks,
            lens,
            runs: runs.map(|r| {
                let n = r.len() / 2;
                (r, n)
            }),
            rows: table.rows(),
            width: table.width(),
            rows_needed: table.rows_needed(),
            max_len: table.lens().iter().max().map_or(0, |&l| l as usize),
        }
    }

    /// Copies `table` to the device of `stream` (enqueued on it).
    pub fn upload_on(stream: &Arc<CudaStream>, table: &PageTable) -> candle_core::Result<Self> {
        let (blocks, lens) = Self::host_arrays(table);
        let blocks = stream.clone_htod(&blocks).map_err(wrap)?;
        let lens = stream.clone_htod(&lens).map_err(wrap)?;
        let runs = match Self::host_runs(table) {
            Some(r) => Some(stream.clone_htod(&r).map_err(wrap)?),
            None => None,
        };
        Ok(Self::from_slices(table, blocks, lens, runs))
    }

    /// Copies `table` to `device` (on candle's stream).
    #[cfg(feature = "cuda")]
    pub fn upload(
        device: &candle_core::CudaDevice,
        table: &PageTable,
    ) -> candle_core::Result<Self> {
        let (blocks, lens) = Self::host_arrays(table);
        let blocks = device.clone_htod(&blocks)?;
        let lens = device.clone_htod(&lens)?;
        let runs = match Self::host_runs(table) {
            Some(r) => Some(device.clone_htod(&r)?),
            None => None,
        };
        Ok(Self::from_slices(table, blocks, lens, runs))
    }

    /// Decode rows of the table.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The largest pool row the table reads, plus one.
    pub fn rows_needed(&self) -> usize {
        self.rows_needed
    }

    /// Tokens of the longest row.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Whether the table is prefill-shaped (runs of rows with the same blocks, see
    /// [`kernels::chunk_shaped`]): then [`launch_chunk`] serves it.
    pub fn chunk_shaped(&self) -> bool {
        self.runs.is_some()
    }
}

/// Enqueues the tensor-core prefill kernel (`fam_paged_bf16_d*` of the fused attention's
/// tensor-core module, `func`) for a prefill-shaped `table`: `out` (like q, bf16) is written in
/// full.
pub fn launch_chunk<T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    func: &CudaFunction,
    dims: &CallDims,
    (q, k, v): (&CudaView<'_, T>, &CudaView<'_, T>, &CudaView<'_, T>),
    table: &DeviceTable,
    out: &mut CudaViewMut<'_, T>,
) -> candle_core::Result<()> {
    let Some((runs, n_runs)) = &table.runs else {
        candle_core::bail!("paged attention: the table is not prefill-shaped");
    };
    check_call(dims, (q.len(), k.len(), v.len(), out.len()), table)?;
    if dims.rows == 0 {
        return Ok(());
    }
    let (heads, kv_heads, d, width) = (
        fit(dims.heads, "heads")?,
        fit(dims.kv_heads, "kv heads")?,
        fit(dims.d, "head dim")?,
        fit(table.width, "table width")?,
    );
    let cfg = LaunchConfig {
        grid_dim: (grid_of(n_runs * dims.heads)?, 1, 1),
        block_dim: (crate::model::flash_attn::kernels::THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut launch = stream.launch_builder(func);
    launch
        .arg(q)
        .arg(k)
        .arg(v)
        .arg(&table.blocks)
        .arg(&table.lens)
        .arg(runs)
        .arg(out)
        .arg(&heads)
        .arg(&kv_heads)
        .arg(&d)
        .arg(&width)
        .arg(&dims.scale);
    // SAFETY: the arguments match `fam_paged_bf16_d*(const bf16* q, const bf16* k_pool, const
    // bf16* v_pool, const unsigned* blocks, const unsigned* lens, const unsigned* tiles, bf16*
    // out, unsigned heads, unsigned kv_heads, unsigned d, unsigned width, float scale)` (T is
    // bf16: the caller loads this entry for bf16 only). Sizes are checked above; `runs` holds
    // n_runs (first row, rows <= 64) pairs of consecutive rows with identical block lists,
    // covering the table's rows, computed from the validated host table, so each block reads
    // pool rows its rows' lengths cover (below `rows_needed <= pool_rows`) and writes only its
    // own rows of `out` for its query head. Grid n_runs * heads.
    unsafe { launch.launch(cfg) }.map_err(wrap)?;
    Ok(())
}

/// The shape and scale of one call: q/out `(rows, heads, d)`, the pools
/// `(pool_rows, kv_heads, d)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CallDims {
    /// Decode rows (one query token each).
    pub rows: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (divides `heads`).
    pub kv_heads: usize,
    /// Head dimension (at most [`kernels::MAX_HEAD_DIM`]).
    pub d: usize,
    /// Rows of each pool.
    pub pool_rows: usize,
    /// Multiplier of the scores.
    pub scale: f32,
}

impl CallDims {
    fn q_len(&self) -> usize {
        self.rows * self.heads * self.d
    }

    fn pool_len(&self) -> usize {
        self.pool_rows * self.kv_heads * self.d
    }
}

fn fit(x: usize, what: &str) -> candle_core::Result<u32> {
    u32::try_from(x).map_err(|_| {
        candle_core::Error::Msg(format!("paged attention: {what} {x} does not fit in u32"))
    })
}

fn check_len(what: &str, got: usize, want: usize) -> candle_core::Result<()> {
    if got != want {
        candle_core::bail!("paged attention: {what} holds {got} elements, the shape needs {want}");
    }
    Ok(())
}

fn wrap(e: cudarc::driver::DriverError) -> candle_core::Error {
    candle_core::Error::wrap(e)
}

/// The entry point of `paged_attn.cu` for `dtype` and head dimension `d`; an error above the
/// kernel's bound.
pub fn entry(dtype: kernels::KernelDtype, d: usize) -> candle_core::Result<&'static str> {
    match kernels::entry(dtype, d) {
        Some(name) => Ok(name),
        None => candle_core::bail!(
            "paged attention: head dim {d} is not supported by the CUDA kernel (1..={})",
            kernels::MAX_HEAD_DIM
        ),
    }
}

/// The SM count of the device of `stream`, queried once per device and kept for the process.
pub fn sm_count(stream: &Arc<CudaStream>) -> candle_core::Result<usize> {
    static SMS: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());
    let ctx = stream.context();
    let mut sms = SMS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&n) = sms.get(&ctx.ordinal()) {
        return Ok(n);
    }
    let n = ctx
        .attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )
        .map_err(wrap)?;
    let n = usize::try_from(n).unwrap_or(0);
    sms.insert(ctx.ordinal(), n);
    Ok(n)
}

/// The split [`launch`] picks for `rows` rows of up to `max_len` tokens on the device of
/// `stream`: [`kernels::split_plan`] with the device's SM count.
pub fn split_plan(
    stream: &Arc<CudaStream>,
    rows: usize,
    heads: usize,
    kv_heads: usize,
    max_len: usize,
) -> candle_core::Result<SplitPlan> {
    Ok(kernels::split_plan(
        rows,
        kv_heads,
        kernels::query_chunks(heads, kv_heads),
        max_len,
        sm_count(stream)?,
    ))
}

/// The kernels of one dtype: [`entry`]`(dtype, d)` (pass 1, or the whole unsplit call) and
/// [`kernels::combine_entry`]`(dtype)` (pass 2).
#[derive(Debug, Clone, Copy)]
pub struct Funcs<'a> {
    /// `paged_decode_*`.
    pub decode: &'a CudaFunction,
    /// `paged_combine_*`.
    pub combine: &'a CudaFunction,
}

/// The checks both launchers make before reading anything: shapes, the table against the
/// pools, buffer lengths (`q`, `k`, `v`, `out` elements).
fn check_call(
    dims: &CallDims,
    (q, k, v, out): (usize, usize, usize, usize),
    table: &DeviceTable,
) -> candle_core::Result<()> {
    if dims.d == 0 || dims.d > kernels::MAX_HEAD_DIM {
        candle_core::bail!(
            "paged attention: head dim {} is not supported by the CUDA kernel (1..={})",
            dims.d,
            kernels::MAX_HEAD_DIM
        );
    }
    if dims.kv_heads == 0 || !dims.heads.is_multiple_of(dims.kv_heads) {
        candle_core::bail!(
            "paged attention: {} heads do not split into {} kv heads",
            dims.heads,
            dims.kv_heads
        );
    }
    if table.rows != dims.rows {
        candle_core::bail!(
            "paged attention: a table of {} rows for {} query rows",
            table.rows,
            dims.rows
        );
    }
    if table.rows_needed > dims.pool_rows {
        candle_core::bail!(
            "paged attention: the table reads pool row {} of {}",
            table.rows_needed - 1,
            dims.pool_rows
        );
    }
    check_len("q", q, dims.q_len())?;
    check_len("k pool", k, dims.pool_len())?;
    check_len("v pool", v, dims.pool_len())?;
    check_len("out", out, dims.q_len())?;
    if dims.q_len() > 0 {
        check_len(
            "block table",
            table.blocks.len(),
            (dims.rows * table.width).max(1),
        )?;
        check_len("lens", table.lens.len(), dims.rows)?;
    }
    Ok(())
}

/// A 1-D grid of `blocks` blocks, or an error when the driver could not launch it.
fn grid_of(blocks: usize) -> candle_core::Result<u32> {
    u32::try_from(blocks)
        .ok()
        .filter(|&b| b < i32::MAX as u32)
        .ok_or_else(|| candle_core::Error::Msg(format!("paged attention: grid of {blocks} blocks")))
}

/// Enqueues the paged decode attention: `out` (like `q`) is written in full. `funcs` are those
/// of the dtype of `T` and `dims.d`; `table` was uploaded from the host table the shapes came
/// from. `splits`: `None` picks them with [`split_plan`] (the device's SM count, the table's
/// longest row), `Some(n)` forces `n` splits ([`SplitPlan::forced`]; for tests). Returns the
/// split used; with more than one split the f32 workspace of pass 1 is allocated on `stream`
/// for the call (freed in stream order).
pub fn launch<T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    funcs: Funcs<'_>,
    dims: &CallDims,
    (q, k, v): (&CudaView<'_, T>, &CudaView<'_, T>, &CudaView<'_, T>),
    table: &DeviceTable,
    out: &mut CudaViewMut<'_, T>,
    splits: Option<usize>,
) -> candle_core::Result<SplitPlan> {
    check_call(dims, (q.len(), k.len(), v.len(), out.len()), table)?;
    if dims.q_len() == 0 {
        return Ok(SplitPlan::unsplit(table.max_len));
    }
    let (heads, kv_heads, d) = (
        fit(dims.heads, "heads")?,
        fit(dims.kv_heads, "kv heads")?,
        fit(dims.d, "head dim")?,
    );
    let width = fit(table.width, "table width")?;
    let q_chunks = fit(
        kernels::query_chunks(dims.heads, dims.kv_heads),
        "query chunks",
    )?;
    let plan = match splits {
        Some(n) => SplitPlan::forced(table.max_len, n),
        None => split_plan(stream, dims.rows, dims.heads, dims.kv_heads, table.max_len)?,
    };
    let blocks = grid_of(plan.grid(dims.rows, dims.heads, dims.kv_heads))?;
    let (n_splits, split_blocks) = (
        fit(plan.splits, "splits")?,
        fit(plan.split_blocks, "split blocks")?,
    );
    // Pass 1's records: every (row, head, split) record is written by pass 1 before pass 2
    // reads it (same stream), so the buffer need not be zeroed. None when unsplit: the kernel
    // gets a null `part` and does not touch it.
    let ws_len = plan.workspace_len(dims.rows, dims.heads, dims.d);
    let mut part = if ws_len > 0 {
        // SAFETY: f32 has no invalid bit patterns, and the contents are written before being
        // read (above).
        Some(unsafe { stream.alloc::<f32>(ws_len) }.map_err(wrap)?)
    } else {
        None
    };
    let null_part: u64 = 0;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    {
        let mut launch = stream.launch_builder(funcs.decode);
        launch
            .arg(q)
            .arg(k)
            .arg(v)
            .arg(&table.blocks)
            .arg(&table.lens)
            .arg(&mut *out);
        match part.as_mut() {
            Some(part) => launch.arg(part),
            None => launch.arg(&null_part),
        };
        launch
            .arg(&heads)
            .arg(&kv_heads)
            .arg(&d)
            .arg(&width)
            .arg(&q_chunks)
            .arg(&n_splits)
            .arg(&split_blocks)
            .arg(&dims.scale);
        // SAFETY: the arguments match `paged_decode_*(const T* q, const T* k, const T* v, const
        // unsigned* blocks, const unsigned* lens, T* out, float* part, unsigned heads, unsigned
        // kv_heads, unsigned d, unsigned width, unsigned q_chunks, unsigned splits, unsigned
        // split_blocks, float scale)` (`part` a 64-bit zero, a null pointer, when unsplit: then
        // the kernel does not touch it). q/out hold rows * heads * d and the pools pool_rows *
        // kv_heads * d elements (checked above); the table has rows * width block ids and rows
        // lengths, uploaded from a validated host table whose every row reads pool rows below
        // `rows_needed <= pool_rows` only (checked above), so every load is in bounds (a split
        // reads only cache blocks below its row's length). The grid is rows * kv_heads * splits
        // * q_chunks; each block writes only the out rows of its own (row, query heads) when
        // unsplit, else only its own records of `part` (rows * heads * splits * (d + 2) floats,
        // the workspace's length).
        unsafe { launch.launch(cfg) }.map_err(wrap)?;
    }
    if let Some(part) = &part {
        let cfg = LaunchConfig {
            grid_dim: (grid_of(dims.rows * dims.heads)?, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = stream.launch_builder(funcs.combine);
        launch.arg(part).arg(out).arg(&d).arg(&n_splits);
        // SAFETY: the arguments match `paged_combine_*(const float* part, T* out, unsigned d,
        // unsigned splits)`; the grid is rows * heads, block i reads records [i * splits,
        // (i + 1) * splits) of d + 2 floats of `part` (written by pass 1 above, on the same
        // stream) and writes row i (d elements) of `out` (rows * heads * d, checked above).
        unsafe { launch.launch(cfg) }.map_err(wrap)?;
    }
    Ok(plan)
}

/// The candle side: candle's device buffers in, [`launch`] on candle's stream.
#[cfg(feature = "cuda")]
mod on_cuda {
    use candle_core::cuda_backend::{CudaDType, CudaDevice};
    use candle_core::{CudaStorage, Layout, Shape};
    use cudarc::driver::{CudaSlice, CudaView, DeviceRepr, ValidAsZeroBits};

    use super::super::cpu::Dims;
    use super::super::kernels::{chunk_entry, combine_entry, KernelDtype};
    use super::{entry, launch, launch_chunk, ptx, CallDims, DeviceTable, Funcs};
    use crate::model::flash_attn::cuda as flash;
    use crate::model::flash_attn::kernels as flash_kernels;

    /// candle's cache key for the loaded `paged_attn.cu` module.
    const MODULE: &str = "cascade_paged_attn";
    /// The fused attention's tensor-core module (its key there: one load per process).
    const MMA_MODULE: &str = flash::MMA_MODULE;

    /// The elements of a contiguous tensor's device buffer.
    fn view<'a, T>(
        slice: &'a CudaSlice<T>,
        layout: &Layout,
        what: &str,
    ) -> candle_core::Result<CudaView<'a, T>> {
        match layout.contiguous_offsets() {
            Some((start, end)) => Ok(slice.slice(start..end)),
            None => candle_core::bail!("paged attention: {what} is not contiguous"),
        }
    }

    /// [`super::super::paged_attention`] on the GPU: `q` `(rows, heads, d)`, the pools
    /// `(pool_rows, kv_heads, d)` (shapes from the layouts, `dims` from them), `table` uploaded
    /// from the op's page table. Returns the output `(rows, heads, d)`.
    pub(crate) fn forward<T: DeviceRepr + ValidAsZeroBits + CudaDType>(
        device: &CudaDevice,
        (q, k, v): (&CudaSlice<T>, &CudaSlice<T>, &CudaSlice<T>),
        (lq, lk, lv): (&Layout, &Layout, &Layout),
        dims: Dims,
        table: &DeviceTable,
        scale: f32,
        dtype: KernelDtype,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let (rows, heads, d) = lq.shape().dims3()?;
        let (pool_rows, kv_heads, dk) = lk.shape().dims3()?;
        if (heads, kv_heads, d) != (dims.heads, dims.kv_heads, dims.d) || dk != d {
            candle_core::bail!(
                "paged attention: q {:?} and pools {:?} do not match {dims:?}",
                lq.dims(),
                lk.dims()
            );
        }
        let call = CallDims {
            rows,
            heads,
            kv_heads,
            d,
            pool_rows,
            scale,
        };
        let mut out = device.alloc_zeros::<T>(lq.shape().elem_count())?;
        let (q, k, v) = (
            view(q, lq, "q")?,
            view(k, lk, "k pool")?,
            view(v, lv, "v pool")?,
        );
        // Prefill chunks in bf16 on tensor cores (compute capability 8.0+), in the fused
        // attention's tensor-core module.
        if dtype == KernelDtype::Bf16 && table.chunk_shaped() {
            let (major, _) = device
                .cuda_stream()
                .context()
                .compute_capability()
                .map_err(candle_core::Error::wrap)?;
            let cores = flash::uses_tensor_cores(flash_kernels::KernelDtype::Bf16, major);
            if let (true, Some(name)) = (cores, chunk_entry(d)) {
                let func = device.get_or_load_custom_func(name, MMA_MODULE, flash::mma_ptx()?)?;
                launch_chunk(
                    &device.cuda_stream(),
                    &func,
                    &call,
                    (&q, &k, &v),
                    table,
                    &mut out.as_view_mut(),
                )?;
                return Ok((
                    CudaStorage::wrap_cuda_slice(out, device.clone()),
                    lq.shape().clone(),
                ));
            }
        }
        let decode = device.get_or_load_custom_func(entry(dtype, d)?, MODULE, ptx()?)?;
        let combine = device.get_or_load_custom_func(combine_entry(dtype), MODULE, ptx()?)?;
        launch(
            &device.cuda_stream(),
            Funcs {
                decode: &decode,
                combine: &combine,
            },
            &call,
            (&q, &k, &v),
            table,
            &mut out.as_view_mut(),
            None,
        )?;
        Ok((
            CudaStorage::wrap_cuda_slice(out, device.clone()),
            lq.shape().clone(),
        ))
    }
}

#[cfg(feature = "cuda")]
pub(crate) use on_cuda::forward;
