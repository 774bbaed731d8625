//! The step memory reading of `metrics.jsonl` (`peak_rss_mb`), in a process of its own so that
//! no other test allocates meanwhile.

use candle_core::Device;
use cascade_shared::metrics::{rss_mb, StepMemory};

#[test]
fn a_step_that_allocates_shows_in_its_peak() {
    let m = StepMemory::start();
    if !m.exact() {
        // No resettable high-water mark here: nothing to check.
        return;
    }
    let before = rss_mb().expect("Linux has VmRSS");
    // Touch 256 MiB, then free it: the step's peak must include it.
    let big = vec![1u8; 256 << 20];
    std::hint::black_box(&big);
    drop(big);
    let reading = m.finish(&Device::Cpu);
    let peak = reading.peak_rss_mb.expect("Linux has VmHWM");
    assert!(
        peak >= before + 200.0,
        "peak {peak} MiB, before {before} MiB"
    );
    assert_eq!(reading.device_memory_mb, None);
    // A new step starts again from the current RSS.
    let m = StepMemory::start();
    let again = m.finish(&Device::Cpu).peak_rss_mb.unwrap();
    assert!(again < peak - 100.0, "reset peak {again} MiB vs {peak} MiB");
}
