//! Memory readings of a training step: the host's peak resident set size and, on a GPU, the
//! device memory in use.
//!
//! **Heap peak of a step**: with [`super::CountingAlloc`] as the global allocator, the largest
//! number of bytes held by allocations during the step ([`StepMemory::start`] resets it).
//!
//! **Host peak of a step** (Linux): [`StepMemory::start`] writes `5` to `/proc/self/clear_refs`,
//! which resets the kernel's high-water mark `VmHWM` to the current RSS; [`StepMemory::finish`]
//! reads `VmHWM` from `/proc/self/status`. Where the reset is refused (not Linux, or a kernel
//! without it), the reading is the peak since the process started (an upper bound of the
//! step's peak), and [`StepMemory::exact`] says so. Elsewhere there is no reading.
//!
//! **Device** (the `cuda` feature, a CUDA device): memory in use on the device at the end of
//! the step (`total − free` from `cuMemGetInfo`), which includes the caching of the allocator
//! and other processes on the same device; and the step's **device peak**: candle allocates
//! through cudarc's stream-ordered allocator (`cuMemAllocAsync` from the device's default
//! memory pool), whose high-water mark of memory handed out (`CU_MEMPOOL_ATTR_USED_MEM_HIGH`)
//! [`StepMemory::start_on`] resets and [`StepMemory::finish`] reads. That peak counts this
//! process's allocations only, not the CUDA context or cuBLAS workspaces.

use candle_core::Device;

/// A step's memory measurement, started before the step's work.
#[derive(Debug, Clone, Copy)]
pub struct StepMemory {
    /// Whether the high-water mark was reset at the start.
    exact: bool,
}

/// What a step used.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MemoryReading {
    /// Peak host RSS during the step, MiB (see [`StepMemory`] for the fallback).
    pub peak_rss_mb: Option<f64>,
    /// Peak bytes the process's heap held during the step, MiB (binaries with
    /// [`super::CountingAlloc`]): the RSS less what the allocator keeps after frees.
    pub peak_heap_mb: Option<f64>,
    /// Device memory in use at the end of the step, MiB (CUDA only).
    pub device_memory_mb: Option<f64>,
    /// Peak device memory held by this process's allocations during the step, MiB (CUDA only,
    /// where the default memory pool answers; see the module's notes).
    pub device_peak_mb: Option<f64>,
}

impl StepMemory {
    /// Resets the host high-water mark (where the OS allows it) and starts the measurement.
    pub fn start() -> StepMemory {
        super::reset_heap_peak();
        let exact = std::fs::write("/proc/self/clear_refs", "5").is_ok();
        StepMemory { exact }
    }

    /// [`StepMemory::start`], and on a CUDA device also resets the device's peak.
    pub fn start_on(device: &Device) -> StepMemory {
        reset_device_peak_mb(device);
        StepMemory::start()
    }

    /// Whether the peak covers only this step (the high-water mark could be reset).
    pub fn exact(&self) -> bool {
        self.exact
    }

    /// The step's readings, with the device memory of `device` where it can be read.
    pub fn finish(&self, device: &Device) -> MemoryReading {
        MemoryReading {
            peak_rss_mb: peak_rss_mb(),
            peak_heap_mb: super::heap_peak_mb(),
            device_memory_mb: device_memory_mb(device),
            device_peak_mb: device_peak_mb(device),
        }
    }
}

/// Peak resident set size of this process in MiB (Linux `VmHWM`: since the start, or since the
/// last [`StepMemory::start`]), if known.
pub fn peak_rss_mb() -> Option<f64> {
    status_kb("VmHWM:").map(|kb| kb / 1024.0)
}

/// Current resident set size of this process in MiB (Linux `VmRSS`), if known.
pub fn rss_mb() -> Option<f64> {
    status_kb("VmRSS:").map(|kb| kb / 1024.0)
}

fn status_kb(key: &str) -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Memory in use on `device` in MiB (CUDA: `total − free` of the device's context); `None` on
/// the CPU or when the driver does not answer.
pub fn device_memory_mb(device: &Device) -> Option<f64> {
    match device {
        Device::Cpu => None,
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => {
            let stream = dev.cuda_stream();
            let (free, total) = stream.context().mem_get_info().ok()?;
            Some(total.saturating_sub(free) as f64 / (1024.0 * 1024.0))
        }
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

#[cfg(feature = "cuda")]
mod pool {
    use candle_core::cuda_backend::cudarc::driver::sys;
    use candle_core::cuda_backend::CudaDevice;

    /// The device's default memory pool (the one `cuMemAllocAsync` draws from).
    fn default_pool(dev: &CudaDevice) -> Option<sys::CUmemoryPool> {
        let stream = dev.cuda_stream();
        let ctx = stream.context();
        ctx.bind_to_thread().ok()?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `pool` is a valid out-pointer and the device handle comes from a live context.
        let r = unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) };
        (r == sys::CUresult::CUDA_SUCCESS && !pool.is_null()).then_some(pool)
    }

    /// The pool's high-water mark of memory handed out, read, or with `reset` set back to what
    /// is in use now.
    pub(super) fn used_high(dev: &CudaDevice, reset: bool) -> Option<u64> {
        let pool = default_pool(dev)?;
        let attr = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH;
        let mut value: u64 = 0;
        let ptr = &mut value as *mut u64 as *mut std::ffi::c_void;
        // SAFETY: USED_MEM_HIGH is a cuuint64_t attribute and `value` is one; a reset takes 0.
        let r = unsafe {
            if reset {
                sys::cuMemPoolSetAttribute(pool, attr, ptr)
            } else {
                sys::cuMemPoolGetAttribute(pool, attr, ptr)
            }
        };
        (r == sys::CUresult::CUDA_SUCCESS).then_some(value)
    }
}

/// Peak device memory (MiB) handed out by `device`'s default memory pool since the last
/// [`reset_device_peak_mb`] (CUDA only; `None` on the CPU or when the pool does not answer).
pub fn device_peak_mb(device: &Device) -> Option<f64> {
    match device {
        Device::Cpu => None,
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => {
            device.synchronize().ok()?;
            pool::used_high(dev, false).map(|b| b as f64 / (1024.0 * 1024.0))
        }
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

/// Resets the device's peak to what is in use now; whether it could.
pub fn reset_device_peak_mb(device: &Device) -> bool {
    match device {
        Device::Cpu => false,
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => device.synchronize().is_ok() && pool::used_high(dev, true).is_some(),
        #[allow(unreachable_patterns)]
        _ => false,
    }
}
