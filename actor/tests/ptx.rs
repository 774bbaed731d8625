//! Every sampler kernel compiles to PTX with NVRTC (no GPU needed: NVRTC from the
//! `nvidia-cuda-nvrtc` wheel, see `scripts/setup-nvrtc.sh`, on `LD_LIBRARY_PATH`).
//!
//! Without NVRTC the test fails when `CASCADE_REQUIRE_NVRTC=1` or `CI` is set, and otherwise
//! skips with a message on stderr.
#![cfg(feature = "cuda-kernels")]

use cascade_actor::sampler::cuda::{compile, nvrtc_available};
use cascade_actor::sampler::kernels::{SOURCES, THREADS};
use cascade_actor::sampler::SamplerError;

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

#[test]
fn every_kernel_compiles_to_ptx() {
    if !nvrtc_or_skip() {
        return;
    }
    for (name, source) in SOURCES {
        let name: &'static str = name;
        let ptx = compile(name, source).unwrap_or_else(|e| panic!("{e}"));
        let text = ptx.to_src();
        assert!(text.contains(".version"), "{name}: not PTX");
        if name == "sampler.cu" {
            for entry in ["sample_rows", "philox_kat"] {
                // Both run in blocks of 1024 threads: the launch bound must reach the PTX, so
                // that the driver's ptxas keeps each thread within 64 registers.
                let at = text
                    .find(&format!(".entry {entry}("))
                    .unwrap_or_else(|| panic!("{name}: no entry {entry}"));
                let body = &text[at..];
                let head = &body[..body.find('{').expect("entry body")];
                assert!(
                    head.contains(&format!(".maxntid {THREADS}, 1, 1")),
                    "{name}: {entry} has no launch bound of {THREADS} threads:\n{head}"
                );
            }
        }
    }
}

#[test]
fn compile_errors_are_reported_with_the_log() {
    if !nvrtc_or_skip() {
        return;
    }
    let err = compile(
        "broken.cu",
        "extern \"C\" __global__ void k() { undeclared = 1; }",
    )
    .expect_err("a broken kernel must not compile");
    match err {
        SamplerError::Compile { kernel, log } => {
            assert_eq!(kernel, "broken.cu");
            assert!(log.contains("undeclared"), "log: {log}");
        }
        other => panic!("unexpected error {other}"),
    }
}
