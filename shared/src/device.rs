//! Device strings (`cpu`, `cuda:N`) to candle devices.

use candle_core::Device;

/// Parses `cpu` or `cuda:N` into a candle device. A CUDA device in a build without the `cuda`
/// feature, or one that does not exist, is an error that says so.
pub fn parse_device(spec: &str) -> Result<Device, String> {
    if spec == "cpu" {
        return Ok(Device::Cpu);
    }
    let Some(index) = spec.strip_prefix("cuda:") else {
        return Err(format!("device `{spec}`: expected `cpu` or `cuda:N`"));
    };
    let index: usize = index
        .parse()
        .map_err(|_| format!("device `{spec}`: `{index}` is not a GPU index"))?;
    if !candle_core::utils::cuda_is_available() {
        return Err(format!(
            "device `{spec}`: this build has no CUDA support (rebuild with `--features cuda`)"
        ));
    }
    Device::new_cuda(index).map_err(|e| {
        // candle appends a backtrace on the following lines; the first line says what failed.
        let e = e.to_string();
        format!("device `{spec}`: {}", e.lines().next().unwrap_or_default())
    })
}

/// candle's setting for how long an idle worker of its CPU elementwise pool spins before it
/// parks (candle's default: 25 000 rounds).
const SPIN_LIMIT_VAR: &str = "CANDLE_BARRIER_POOL_SPIN_LIMIT";

/// Our default for [`SPIN_LIMIT_VAR`]. candle runs elementwise ops on its own pool and
/// matmuls on rayon's, so a worker of one pool that spins after its op holds a core that the
/// other pool's next op needs. With candle's 25 000 rounds, one training step of the 22M bench
/// model (4 × 128 tokens, 2 cores) took 0.97-1.08 s; with 500-5 000 rounds 0.82-0.86 s, and
/// with 0 (park at once: every op then pays a futex wake) 0.99-1.12 s.
const SPIN_LIMIT: &str = "2000";

/// Sets process-wide defaults for candle's CPU thread pools, unless the user set them (see
/// [`SPIN_LIMIT`]). Call first thing in `main`, before any other thread exists and before the
/// first tensor op (candle reads the variable once, when its pool starts).
pub fn set_cpu_pool_defaults() {
    if std::env::var_os(SPIN_LIMIT_VAR).is_none() {
        std::env::set_var(SPIN_LIMIT_VAR, SPIN_LIMIT);
    }
}

/// `mi_option_purge_delay` in mimalloc's `mi_option_e` (v2 header; libmimalloc-sys does not
/// export the constant). -1 = never return freed memory to the OS.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// For binaries whose global allocator is mimalloc (`cascade`, the model bench): freed pages
/// are kept for reuse instead of being returned to the OS. Candle allocates a fresh buffer for
/// every tensor op; returned pages come back zero-filled page by page at the next op (a third
/// of the tiny default's SFT CPU time under glibc's malloc). RSS stays at its peak, which is
/// what we size for. Call first thing in `main`, before any other thread exists.
pub fn keep_freed_memory() {
    // SAFETY: sets a process-wide option before any other thread exists.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu_and_rejects_garbage() {
        assert!(parse_device("cpu").unwrap().is_cpu());
        assert!(parse_device("gpu0").unwrap_err().contains("expected"));
        assert!(parse_device("cuda:x")
            .unwrap_err()
            .contains("not a GPU index"));
    }
}
