//! Snapshot hot-reload: good snapshots load and are acknowledged; snapshots without their
//! marker, with a checksum mismatch or with tensors of the wrong shape are refused, and the
//! engine keeps generating with the weights it has.

mod common;

use std::path::Path;

use candle_core::Device;
use cascade_actor::engine::{Engine, GenParams, Job};
use cascade_actor::sampler::SamplingParams;
use cascade_actor::snapshot_watch::SnapshotWatch;
use cascade_shared::{Mode, VersionSpan};

fn ack(snapshots: &Path) -> u64 {
    std::fs::read_to_string(snapshots.join("acks/actor-3"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn latest(snapshots: &Path, v: u64) {
    std::fs::write(snapshots.join("LATEST"), format!("{v}\n")).unwrap();
}

#[test]
fn bad_snapshots_are_refused_and_generation_goes_on() {
    let run = tempfile::tempdir().unwrap();
    let snaps = run.path().join("snapshots");
    let cfg = common::tiny_config(256);
    let mut watch = SnapshotWatch::new(&snaps, 3, Device::Cpu);
    assert!(watch.poll(None).unwrap().is_none(), "nothing published yet");

    common::publish_tiny(&snaps, 1, &cfg, 11, 2);
    let w = watch.poll(None).unwrap().expect("v1 loads");
    assert_eq!(
        (w.version, w.state.stage_index, w.state.stage_step),
        (1, 2, 1)
    );
    assert_eq!(ack(&snaps), 1);
    let mut engine = Engine::new(w.model, w.version, 2, vec![]).unwrap();
    engine
        .submit(Job {
            tag: 0,
            prompt_id: 0,
            prompt_ids: vec![1, 2, 3, 4],
            mode: Mode::NoThink,
            group_size: 2,
            params: GenParams {
                sampling: SamplingParams::plain(),
                max_new_tokens: 12,
                seed: 1,
            },
        })
        .unwrap();
    engine.step().unwrap();

    // v2: another shape (3 layers).
    let mut wrong = cfg.clone();
    wrong.num_hidden_layers = 3;
    common::publish_tiny(&snaps, 2, &wrong, 12, 2);
    assert!(watch.poll(Some(engine.model().config())).unwrap().is_none());
    assert_eq!(watch.refused(), 1);
    assert_eq!(ack(&snaps), 1, "the ack goes back to the weights in use");
    engine.step().unwrap();

    // v3: no completion marker.
    common::publish_tiny(&snaps, 3, &cfg, 13, 2);
    std::fs::remove_file(snaps.join("v000003/COMPLETE")).unwrap();
    assert!(watch.poll(Some(engine.model().config())).unwrap().is_none());
    // v4: a flipped byte in the weights (checksum mismatch).
    common::publish_tiny(&snaps, 4, &cfg, 14, 2);
    let p = snaps.join("v000004/model.safetensors");
    let mut bytes = std::fs::read(&p).unwrap();
    let n = bytes.len();
    bytes[n - 5] ^= 0x40;
    std::fs::write(&p, bytes).unwrap();
    assert!(watch.poll(Some(engine.model().config())).unwrap().is_none());
    assert_eq!(watch.refused(), 3);
    assert_eq!(watch.current(), Some(1));
    // The same bad LATEST is not retried at every step.
    assert!(watch.poll(Some(engine.model().config())).unwrap().is_none());
    assert_eq!(watch.refused(), 3);
    engine.step().unwrap();

    // v5 is good: swapped in mid-sequence.
    common::publish_tiny(&snaps, 5, &cfg, 15, 3);
    let w5 = watch
        .poll(Some(engine.model().config()))
        .unwrap()
        .expect("v5 loads");
    assert_eq!(w5.state.stage_index, 3);
    engine.swap_model(w5.model, w5.version).unwrap();
    assert_eq!(ack(&snaps), 5);
    let out = engine.run_to_completion().unwrap();
    assert_eq!(out.len(), 2);
    for f in out {
        assert_eq!(f.response_ids.len(), 12);
        assert_eq!(
            f.versions,
            vec![
                VersionSpan {
                    start_token: 0,
                    version: 1
                },
                VersionSpan {
                    start_token: 4,
                    version: 5
                }
            ]
        );
    }
    // LATEST pointing back at an older version changes nothing.
    latest(&snaps, 1);
    assert!(watch.poll(Some(engine.model().config())).unwrap().is_none());
    assert_eq!(watch.current(), Some(5));
}
