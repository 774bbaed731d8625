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

/// A learner resumed from its last checkpoint removes the weights-only snapshots after it and
/// points LATEST back at the checkpoint: an actor whose snapshot was removed loads the
/// checkpoint's weights, then follows the versions the learner publishes again. An older
/// LATEST while the actor's own snapshot still exists is not a rollback and changes nothing.
#[test]
fn an_actor_follows_the_learner_back_to_its_checkpoint() {
    let run = tempfile::tempdir().unwrap();
    let snaps = run.path().join("snapshots");
    let cfg = common::tiny_config(256);
    let mut watch = SnapshotWatch::new(&snaps, 3, Device::Cpu);
    common::publish_tiny(&snaps, 3, &cfg, 13, 1);
    common::publish_tiny(&snaps, 5, &cfg, 15, 1);
    assert_eq!(watch.poll(None).unwrap().expect("v5 loads").version, 5);
    // An older LATEST with v5 still there: nothing to do.
    latest(&snaps, 3);
    assert!(watch.poll(None).unwrap().is_none());
    assert_eq!(watch.current(), Some(5));
    // The resumed learner removed v5: back to v3.
    latest(&snaps, 5);
    assert!(watch.poll(None).unwrap().is_none());
    std::fs::remove_dir_all(snaps.join("v000005")).unwrap();
    latest(&snaps, 3);
    let back = watch.poll(None).unwrap().expect("the checkpoint loads");
    assert_eq!(back.version, 3);
    assert_eq!(ack(&snaps), 3);
    // The learner's new v4 and v5 are taken as they come.
    common::publish_tiny(&snaps, 4, &cfg, 24, 1);
    assert_eq!(watch.poll(None).unwrap().expect("v4").version, 4);
    common::publish_tiny(&snaps, 5, &cfg, 25, 1);
    assert_eq!(watch.poll(None).unwrap().expect("new v5").version, 5);
}
