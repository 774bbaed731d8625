//! The best-response log of RL stages that later stages replay (`sft_mix.replay`, issue 19):
//! which response of a group is kept, the file's round trip, checksums, and how a resumed
//! stage cuts it back.

use cascade_learner::run::best::{self, Best};
use cascade_shared::{
    FinishReason, Mode, RolloutGroup, Sample, SampleTiming, StageKind, VersionSpan,
};

fn group(prompt: u32, mode: Mode, responses: &[(&[u32], f32)]) -> RolloutGroup {
    RolloutGroup {
        stage: StageKind::Rlhf,
        stage_index: 2,
        prompt_id: u64::from(prompt),
        mode,
        actor_id: 0,
        prompt_ids: vec![prompt, prompt + 1],
        temperature: 0.6,
        samples: responses
            .iter()
            .map(|(ids, reward)| Sample {
                response_ids: ids.to_vec(),
                behaviour_logprobs: vec![-1.0; ids.len()],
                policy_versions: vec![VersionSpan {
                    start_token: 0,
                    version: 0,
                }],
                finish_reason: FinishReason::Stop,
                reward: *reward,
                reward_breakdown: vec![],
                timing: SampleTiming::default(),
            })
            .collect(),
    }
}

#[test]
fn the_best_response_above_its_group_mean_is_kept() {
    let groups = [
        // The highest reward; ties go to the first.
        group(
            10,
            Mode::Think,
            &[(&[1], 0.5), (&[2, 3], 2.0), (&[4], 2.0), (&[5], -1.0)],
        ),
        // All equal: nothing above the mean.
        group(20, Mode::NoThink, &[(&[6], 1.0), (&[7], 1.0)]),
        // A non-finite reward is never the best.
        group(
            30,
            Mode::NoThink,
            &[(&[8], f32::NAN), (&[9], 0.0), (&[11], 1.0)],
        ),
    ];
    let kept = best::best_of(7, &groups);
    assert_eq!(kept.len(), 2, "{kept:?}");
    assert_eq!(
        kept[0],
        Best {
            step: 7,
            prompt_ids: vec![10, 11],
            response_ids: vec![2, 3],
            reward: 2.0,
            think: true,
        }
    );
    assert_eq!(
        (kept[1].response_ids.as_slice(), kept[1].think),
        (&[11][..], false)
    );
    // As an SFT example: the prompt is context, the response is trained.
    let ex = kept[0].example();
    assert_eq!(ex.ids, [10, 11, 2, 3]);
    assert_eq!(ex.trained, [false, false, true, true]);
    assert_eq!(ex.mode, Mode::Think);
}

fn entry(step: u64, r: u32) -> Best {
    Best {
        step,
        prompt_ids: vec![1, 2, 3],
        response_ids: vec![r, r + 1],
        reward: r as f32 / 2.0,
        think: r.is_multiple_of(2),
    }
}

#[test]
fn the_file_round_trips_and_a_resumed_stage_cuts_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path();
    assert!(
        best::read(run, 3).unwrap().is_empty(),
        "no file: no entries"
    );
    best::truncate_after(run, 3, 0).unwrap();
    let all: Vec<Best> = (1..=4)
        .flat_map(|s| [entry(s, 10 * s as u32), entry(s, 1)])
        .collect();
    for s in 1..=4 {
        let of_step: Vec<Best> = all.iter().filter(|b| b.step == s).cloned().collect();
        best::append(run, 3, &of_step).unwrap();
    }
    assert_eq!(best::read(run, 3).unwrap(), all);
    // Resumed from the state of step 2: the lines of steps 3 and 4 go (they are trained again).
    best::truncate_after(run, 3, 2).unwrap();
    let kept: Vec<Best> = all.iter().filter(|b| b.step <= 2).cloned().collect();
    assert_eq!(best::read(run, 3).unwrap(), kept);
    // Idempotent.
    best::truncate_after(run, 3, 2).unwrap();
    assert_eq!(best::read(run, 3).unwrap(), kept);
}

#[test]
fn a_torn_last_line_is_dropped_on_resume_and_corruption_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path();
    best::truncate_after(run, 0, 0).unwrap(); // creates the directory
    best::append(run, 0, &[entry(1, 2), entry(2, 4)]).unwrap();
    let path = best::path(run, 0);
    let text = std::fs::read_to_string(&path).unwrap();

    // A crash in the middle of appending step 3's line.
    let torn = format!("{text}{{\"step\":3,\"prompt_ids\":[1,");
    std::fs::write(&path, &torn).unwrap();
    let e = best::read(run, 0).unwrap_err().to_string();
    assert!(e.contains("stage-0.jsonl") && e.contains('3'), "{e}");
    best::truncate_after(run, 0, 2).unwrap();
    assert_eq!(best::read(run, 0).unwrap(), [entry(1, 2), entry(2, 4)]);

    // A flipped token in a complete line: the checksum names it, reading and resuming refuse.
    let flipped = text.replacen("[2,3]", "[2,9]", 1);
    assert_ne!(flipped, text);
    std::fs::write(&path, &flipped).unwrap();
    let e = best::read(run, 0).unwrap_err().to_string();
    assert!(e.contains("stage-0.jsonl") && e.contains("checksum"), "{e}");
    let e = best::truncate_after(run, 0, 5).unwrap_err().to_string();
    assert!(e.contains("stage-0.jsonl"), "{e}");
}
