//! The NCCL backend of the learner group's collectives (`cascade_shared::nccl`, issue 17).
//! Without a CUDA driver or NCCL (CI, this machine) joining is an error, never a panic. On a GPU
//! (`scripts/gpu-check.sh`), a one-rank NCCL group gives what the CPU backend gives for every
//! operation, f32 and f64, on lengths that include empty, uneven and more than one bucket.
#![cfg(feature = "nccl")]

use std::time::Duration;

use cascade_shared::collective::{shard_range, Collective, Single, BUCKET};
use cascade_shared::nccl::NcclGroup;

const T: Duration = Duration::from_secs(60);

/// A one-rank NCCL group on device 0, or why there is none.
fn group() -> Result<NcclGroup, String> {
    NcclGroup::new(Box::new(Single), 0, T).map_err(|e| e.to_string())
}

#[test]
fn without_a_gpu_or_nccl_joining_is_an_error_not_a_panic() {
    match group() {
        Ok(_) => eprintln!("a GPU and NCCL are present: nothing to check here"),
        Err(e) => assert!(
            e.contains("no CUDA driver") || e.contains("no NCCL") || e.contains("nccl init"),
            "{e}"
        ),
    }
}

#[test]
fn one_rank_nccl_gives_the_cpu_backends_results() {
    let mut g = match group() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    let mut cpu = Single;
    for len in [0usize, 1, 5, 1000, BUCKET + 3] {
        let data: Vec<f32> = (0..len).map(|i| (i % 977) as f32 / 7.0 - 60.0).collect();
        let data64: Vec<f64> = data.iter().map(|&x| f64::from(x) + 1e-12).collect();
        let (mut a, mut b) = (data.clone(), data.clone());
        g.all_reduce_sum(&mut a).unwrap();
        cpu.all_reduce_sum(&mut b).unwrap();
        assert_eq!(a, b, "all_reduce f32, len {len}");
        let (mut a, mut b) = (data64.clone(), data64.clone());
        g.all_reduce_sum_f64(&mut a).unwrap();
        cpu.all_reduce_sum_f64(&mut b).unwrap();
        assert_eq!(a, b, "all_reduce f64, len {len}");
        let n = shard_range(len, 0, 1).len();
        let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
        g.reduce_scatter_sum(&data, &mut a).unwrap();
        cpu.reduce_scatter_sum(&data, &mut b).unwrap();
        assert_eq!(a, b, "reduce_scatter f32, len {len}");
        let (mut a, mut b) = (vec![0f64; n], vec![0f64; n]);
        g.reduce_scatter_sum_f64(&data64, &mut a).unwrap();
        cpu.reduce_scatter_sum_f64(&data64, &mut b).unwrap();
        assert_eq!(a, b, "reduce_scatter f64, len {len}");
        let mut a = vec![f32::NAN; len];
        g.all_gather(&data, &mut a).unwrap();
        assert_eq!(a, data, "all_gather, len {len}");
        let mut bytes = vec![7u8; 3];
        g.broadcast(&mut bytes, 0).unwrap();
        g.barrier().unwrap();
    }
}
