//! Builds a CUDA kernel source unchanged as C++20 against the CPU emulation (`cuda_emu.h` beside
//! this file; `cuda_emu_io.h` holds the drivers' file input/output) with a driver program, once per test process and configuration. Shared by the
//! emulated kernel tests of several crates (`actor/tests/sampler_kernel_emulated.rs`,
//! `shared/tests/flash_attn_kernel_emulated.rs`), which include it with `#[path]`.
//!
//! The compiler is `$CXX` or `c++`, with `-ffp-contract=off -fno-fast-math` (NVRTC runs the
//! kernels with `--fmad=false`, so float arithmetic rounds the same way) and warnings as errors.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The folder of `cuda_emu.h`.
pub const EMU_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/cuda_emu");

/// Builds (or returns the cached build of) `driver` with `kernel` included as `KERNEL_SOURCE`
/// and `defines` (`NAME=VALUE`) set, into `tmp_dir/cuda_emu/<tag>`. Panics with the
/// compiler's output if it does not build.
pub fn emulated_binary(
    tag: &str,
    kernel: &Path,
    driver: &Path,
    defines: &[String],
    tmp_dir: &Path,
) -> PathBuf {
    static BINS: Mutex<BTreeMap<String, PathBuf>> = Mutex::new(BTreeMap::new());
    let mut bins = BINS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(bin) = bins.get(tag) {
        return bin.clone();
    }
    let dir = tmp_dir.join("cuda_emu");
    std::fs::create_dir_all(&dir).unwrap();
    // Built under a per-process name and renamed: test processes may run side by side.
    let bin = dir.join(tag);
    let building = dir.join(format!("{tag}.{}", std::process::id()));
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let out = Command::new(&cxx)
        .args([
            "-std=c++20",
            "-O2",
            "-ffp-contract=off",
            "-fno-fast-math",
            "-pthread",
        ])
        .args(["-Wall", "-Wextra", "-Werror", "-Wno-unknown-pragmas"])
        .args(defines.iter().map(|d| format!("-D{d}")))
        .arg(format!("-I{EMU_DIR}"))
        .arg("-include")
        .arg(Path::new(EMU_DIR).join("cuda_emu.h"))
        .arg(format!("-DKERNEL_SOURCE=\"{}\"", kernel.display()))
        .arg(driver)
        .arg("-o")
        .arg(&building)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run the C++ compiler {cxx:?} ({e}); install g++ (C++20)")
        });
    assert!(
        out.status.success(),
        "the kernel does not build under the CPU emulation:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&building, &bin).unwrap();
    bins.insert(tag.to_string(), bin.clone());
    bin
}
