//! The attention kernels, fused (`flash_attn.cu`) and paged decode (`paged_attn.cu`), compile
//! to PTX with NVRTC (no GPU needed: NVRTC from the
//! `nvidia-cuda-nvrtc` wheel, see `scripts/setup-nvrtc.sh`, on `LD_LIBRARY_PATH`).
//!
//! Without NVRTC the test fails when `CASCADE_REQUIRE_NVRTC=1` or `CI` is set, and otherwise
//! skips with a message on stderr.
#![cfg(feature = "cuda-kernels")]

use cascade_shared::model::flash_attn::cuda::{compile_mma_ptx, compile_ptx, nvrtc_available};
use cascade_shared::model::flash_attn::kernels::{entry_points, mma_entry_points, THREADS};
use cascade_shared::model::paged;

fn nvrtc_or_skip() -> bool {
    if nvrtc_available() {
        return true;
    }
    let required = std::env::var("CASCADE_REQUIRE_NVRTC").is_ok_and(|v| v == "1")
        || std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false");
    assert!(
        !required,
        "NVRTC (libnvrtc.so.13) not found but required: run scripts/setup-nvrtc.sh and add the \
         lib dir it prints to LD_LIBRARY_PATH"
    );
    eprintln!("SKIPPED: NVRTC not found; set CASCADE_REQUIRE_NVRTC=1 to make this an error");
    false
}

/// The header (up to its `{`) and the body (up to the closing brace at a line start) of the
/// `.entry` named `entry` in `ptx`.
fn entry_in<'a>(ptx: &'a str, entry: &str) -> (&'a str, &'a str) {
    let at = ptx
        .find(&format!(".entry {entry}("))
        .unwrap_or_else(|| panic!("no entry {entry} in the PTX"));
    let body = &ptx[at..];
    let head = &body[..body.find('{').expect("entry body")];
    (head, &body[..body.find("\n}").unwrap_or(body.len())])
}

#[test]
fn flash_attn_kernels_compile_to_ptx() {
    if !nvrtc_or_skip() {
        return;
    }
    let ptx = compile_ptx().unwrap_or_else(|log| panic!("flash_attn.cu: {log}"));
    assert!(ptx.contains(".version"), "not PTX");
    for entry in entry_points() {
        // The launch bound must reach the PTX, so that ptxas keeps every thread of a block of
        // THREADS within the register file.
        let (head, _) = entry_in(&ptx, &entry);
        assert!(
            head.contains(&format!(".maxntid {THREADS}, 1, 1")),
            "{entry} has no launch bound of {THREADS} threads:\n{head}"
        );
    }
}

#[test]
fn tensor_core_kernels_compile_to_ptx() {
    if !nvrtc_or_skip() {
        return;
    }
    let ptx = compile_mma_ptx().unwrap_or_else(|log| panic!("flash_attn_mma.cu: {log}"));
    assert!(ptx.contains(".target sm_80"), "not compiled for compute_80");
    // The fused attention's, and the paged prefill kernel's (launched from the same module).
    let paged = [64, 128].map(|d| paged::kernels::chunk_entry(d).unwrap().to_string());
    for entry in mma_entry_points().into_iter().chain(paged) {
        let (head, body) = entry_in(&ptx, &entry);
        assert!(
            head.contains(&format!(".maxntid {THREADS}, 1, 1")),
            "{entry} has no launch bound of {THREADS} threads:\n{head}"
        );
        // The tile products run on tensor cores, their operands loaded with ldmatrix.
        assert!(
            body.contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"),
            "{entry} has no bf16 mma"
        );
        assert!(
            body.contains("ldmatrix.sync.aligned.m8n8.x4"),
            "{entry} has no ldmatrix"
        );
    }
}

#[test]
fn paged_attn_kernels_compile_to_ptx() {
    if !nvrtc_or_skip() {
        return;
    }
    let threads = paged::kernels::THREADS;
    let ptx = paged::cuda::compile_ptx().unwrap_or_else(|log| panic!("paged_attn.cu: {log}"));
    assert!(ptx.contains(".version"), "not PTX");
    for entry in paged::kernels::entry_points() {
        // The launch bound must reach the PTX, so that ptxas keeps every thread of a block of
        // `threads` (and four such blocks per SM) within the register file.
        let (head, body) = entry_in(&ptx, entry);
        assert!(
            head.contains(&format!(".maxntid {threads}, 1, 1")),
            "{entry} has no launch bound of {threads} threads:\n{head}"
        );
        assert!(
            head.contains(&format!(".minnctapersm {}", 512 / threads)),
            "{entry} does not ask for {} blocks per SM:\n{head}",
            512 / threads
        );
        // The K/V rows are read with 16-byte loads (by the decode kernels; the combine kernels
        // of split calls read f32 records).
        if entry.starts_with("paged_decode_") {
            assert!(
                body.contains("ld.global.nc.v4.u32"),
                "{entry} reads no 16-byte chunks"
            );
        }
    }
    for dtype in [
        paged::kernels::KernelDtype::F32,
        paged::kernels::KernelDtype::Bf16,
    ] {
        let name = paged::kernels::combine_entry(dtype);
        assert!(
            paged::kernels::entry_points().contains(&name),
            "{name} is not checked"
        );
    }
}
