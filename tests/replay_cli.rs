//! End-to-end: `cascade replay inspect` on a log written through the transport traits.

use std::path::Path;
use std::process::Command;

use cascade_replay::WriterOptions;
use cascade_shared::transport::{ReplaySink, RolloutSink};
use cascade_shared::{
    FinishReason, Mode, RolloutGroup, Sample, SampleTiming, StageKind, VersionSpan,
};

fn group(actor_id: u32, prompt_id: u64, version: u64) -> RolloutGroup {
    RolloutGroup {
        stage: StageKind::Math,
        stage_index: 2,
        prompt_id,
        mode: Mode::Think,
        actor_id,
        prompt_ids: vec![10, 11, 12],
        temperature: 1.0,
        samples: vec![Sample {
            response_ids: vec![1, 2, 3],
            behaviour_logprobs: vec![-0.5, -0.25, -1.5],
            policy_versions: vec![VersionSpan {
                start_token: 0,
                version,
            }],
            finish_reason: FinishReason::Stop,
            reward: 1.0,
            reward_breakdown: vec![("math".into(), 1.0)],
            timing: SampleTiming {
                generate_ms: 4.0,
                reward_ms: 0.5,
            },
        }],
    }
}

fn write_log(root: &Path) {
    for (actor, n) in [(0u32, 3u64), (1, 2)] {
        let mut sink = ReplaySink::open(
            root.join(format!("actor-{actor}")),
            WriterOptions::default(),
        )
        .unwrap();
        for i in 0..n {
            sink.send(&group(actor, 100 * actor as u64 + i, 5 + i))
                .unwrap();
        }
        sink.flush().unwrap();
    }
}

fn cascade(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cascade"))
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "cascade panicked: {stderr}");
    (
        out.status.code().expect("exit code, not a signal"),
        String::from_utf8(out.stdout).unwrap(),
    )
}

#[test]
fn inspect_reports_counts_and_ranges_as_json() {
    let root = tempfile::tempdir().unwrap();
    write_log(root.path());
    let (code, out) = cascade(&["replay", "inspect", root.path().to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let actors = v["actors"].as_array().unwrap();
    assert_eq!(actors.len(), 2);
    assert_eq!(actors[0]["actor"], "actor-0");
    assert_eq!(actors[0]["records"], 3);
    assert_eq!(actors[0]["seq_range"], serde_json::json!([0, 2]));
    assert_eq!(actors[0]["policy_version_range"], serde_json::json!([5, 7]));
    assert_eq!(actors[1]["records"], 2);
    assert_eq!(actors[1]["bytes_on_disk"], 64 << 20);
    assert!(actors[1]["corruptions"].as_array().unwrap().is_empty());
}

#[test]
fn dump_decodes_groups() {
    let root = tempfile::tempdir().unwrap();
    write_log(root.path());
    let (code, out) = cascade(&[
        "replay",
        "inspect",
        root.path().join("actor-1").to_str().unwrap(),
        "--dump",
        "5",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with("actor-1: 2 records, seq 0..=1, policy version 5..=6"),
        "{out}"
    );
    let dumped: Vec<serde_json::Value> = out
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(dumped.len(), 2);
    assert_eq!(dumped[1]["seq"], 1);
    let back: RolloutGroup = serde_json::from_value(dumped[1]["group"].clone()).unwrap();
    assert_eq!(back, group(1, 101, 6));
}

#[test]
fn corruption_is_reported_with_file_and_offset_and_exit_code_1() {
    let root = tempfile::tempdir().unwrap();
    write_log(root.path());
    let seg = root
        .path()
        .join("actor-0")
        .join(cascade_replay::segment_file_name(0));
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[64 + 40] ^= 0x01; // inside the first record's payload
    std::fs::write(&seg, &bytes).unwrap();
    let (code, out) = cascade(&[
        "replay",
        "inspect",
        root.path().to_str().unwrap(),
        "--dump",
        "10",
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "CORRUPT {} at offset 64: CRC mismatch",
            seg.display()
        )),
        "{out}"
    );
    assert!(out.contains("actor-0: 2 records, seq 1..=2"), "{out}");
}

#[test]
fn garbage_segment_does_not_crash_inspect() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("actor-7");
    std::fs::create_dir_all(&dir).unwrap();
    let garbage: Vec<u8> = (0..5000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(dir.join(cascade_replay::segment_file_name(0)), garbage).unwrap();
    std::fs::write(dir.join(cascade_replay::segment_file_name(1)), b"").unwrap();
    let (code, out) = cascade(&[
        "replay",
        "inspect",
        root.path().to_str().unwrap(),
        "--dump",
        "3",
        "--json",
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("bad segment magic"), "{out}");
}
