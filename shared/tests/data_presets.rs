//! Every built-in preset on sample rows in its exact public layout (`tests/fixtures/datasets/`,
//! written by `scripts/gen-dataset-fixtures.py`): the schema detected from the columns, the rows
//! accepted, rejected (with file, row and column) and skipped, and the canonical rows of each.

use cascade_shared::chat::Message;
use cascade_shared::data::{DataReader, DataSpec, Kind, Outcome, Preset, Row, RowError, Schema};
use cascade_shared::{Mode, StageKind};
use serde_json::{json, Value};

fn fixture(name: &str) -> String {
    format!(
        "{}/../tests/fixtures/datasets/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

struct Read {
    reader: DataReader,
    accepted: Vec<Row>,
    rejected: Vec<RowError>,
    skipped: Vec<RowError>,
}

fn read_spec(spec: DataSpec) -> Read {
    let reader = DataReader::open(&spec).unwrap_or_else(|e| panic!("{}: {e}", spec.path));
    let (mut accepted, mut rejected, mut skipped) = (Vec::new(), Vec::new(), Vec::new());
    for r in reader.rows_from(0).unwrap() {
        match r.unwrap().outcome {
            Outcome::Accepted(row) => accepted.push(row),
            Outcome::Rejected(e) => rejected.push(e),
            Outcome::Skipped(e) => skipped.push(e),
        }
    }
    Read {
        reader,
        accepted,
        rejected,
        skipped,
    }
}

fn read(name: &str) -> Read {
    read_spec(DataSpec {
        path: fixture(name),
        ..DataSpec::default()
    })
}

fn rl(row: &Row) -> (&[Message], &Value) {
    match row {
        Row::Rl(r) => (&r.messages, &r.reference),
        other => panic!("not an RL row: {other:?}"),
    }
}

/// The presets table: fixture, the preset detected, rows accepted / rejected / skipped.
const TABLE: &[(&str, &str, usize, usize, usize)] = &[
    ("cascade_sft.jsonl", "cascade-sft", 2, 1, 0),
    ("nemotron_sft.jsonl", "nemotron-sft", 4, 1, 0),
    ("nemotron_sft.parquet", "nemotron-sft", 3, 1, 0),
    ("nemotron_rlhf.parquet", "nemotron-rlhf", 2, 1, 0),
    ("nemotron_if.jsonl", "nemotron-if", 2, 1, 0),
    ("nemotron_if.parquet", "nemotron-if", 2, 1, 0),
    ("nemotron_math.jsonl", "nemotron-math", 2, 1, 0),
    ("nemotron_swe.jsonl", "nemotron-swe", 2, 1, 0),
    ("verl_gsm8k.parquet", "verl", 2, 1, 0),
    ("verl_mixed.jsonl", "verl", 2, 1, 0),
    ("dapo_math.parquet", "dapo-math", 2, 0, 0),
    ("trl_sft.jsonl", "trl-sft", 2, 1, 0),
    ("trl_pairs_conversational.jsonl", "trl-pairs", 2, 1, 0),
    ("trl_pairs_implicit.jsonl", "trl-pairs", 1, 1, 0),
    ("openrlhf.jsonl", "openrlhf", 2, 1, 0),
    ("aime_2024.jsonl", "aime", 2, 0, 0),
    ("aime_2025.jsonl", "aime", 2, 0, 0),
    ("math500.jsonl", "math-500", 2, 0, 0),
    ("deepscaler.jsonl", "deepscaler", 2, 0, 0),
    ("ifeval_input_data.jsonl", "ifeval", 2, 1, 0),
    ("livecodebench.jsonl", "livecodebench", 3, 1, 0),
    ("apps.jsonl", "apps", 2, 1, 0),
    ("code_contests.parquet", "code-contests", 1, 1, 0),
    ("swe_bench.parquet", "swe-bench", 1, 1, 0),
    ("swe_smith.jsonl", "swe-smith", 1, 2, 0),
    ("helpsteer3.jsonl", "helpsteer3", 2, 1, 1),
    ("skywork_preference.parquet", "skywork-preference", 2, 0, 0),
];

#[test]
fn every_preset_is_detected_and_maps_its_sample_rows() {
    let mut report = String::new();
    for &(file, preset, accepted, rejected, skipped) in TABLE {
        let r = read(file);
        assert_eq!(r.reader.schema().describe(), preset, "{file}");
        let got = (r.accepted.len(), r.rejected.len(), r.skipped.len());
        assert_eq!(
            got,
            (accepted, rejected, skipped),
            "{file}: {:#?}",
            r.rejected
        );
        for e in &r.rejected {
            assert!(e.path.ends_with(file) && e.row >= 1, "{e}");
        }
        report.push_str(&format!(
            "| {preset} | {file} | {accepted} | {rejected} | {skipped} |\n"
        ));
        // A named preset reads the same as the detected one.
        let named = read_spec(DataSpec {
            path: fixture(file),
            schema: Some(Schema::Preset(Preset::from_name(preset).unwrap())),
            ..DataSpec::default()
        });
        assert_eq!(named.accepted, r.accepted, "{file}");
    }
    println!("{report}");
}

#[test]
fn nemotron_sft_modes_come_from_think_blocks_reasoning_and_system_prompts() {
    let r = read("nemotron_sft.jsonl");
    let sft: Vec<_> = r
        .accepted
        .iter()
        .map(|row| match row {
            Row::Sft(s) => s.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(sft[0].mode, Mode::Think);
    assert_eq!(sft[1].mode, Mode::NoThink);
    assert_eq!(sft[1].messages[1].content, "Hi!");
    assert_eq!(sft[2].mode, Mode::NoThink);
    assert_eq!(
        sft[2].messages.len(),
        2,
        "the mode-only system prompt is dropped"
    );
    assert_eq!(sft[3].mode, Mode::Think);
    assert_eq!(
        sft[3].messages[1].content,
        "<think>\n7 has no divisor between 2 and 6.\n</think>\n\nYes, 7 is prime."
    );
    assert_eq!(r.rejected[0].row, 5);
    assert!(
        r.rejected[0].reason.contains("no_think"),
        "{}",
        r.rejected[0]
    );
}

#[test]
fn rl_rows_carry_the_reference_fields_their_verifier_takes() {
    let r = read("nemotron_if.parquet");
    let (msgs, reference) = rl(&r.accepted[1]);
    assert_eq!(msgs[0].role, "user");
    assert_eq!(
        reference["kwargs"],
        json!([{"keywords": ["umbrella"]}, {"end_phrase": "Stay dry."}])
    );
    assert_eq!(r.rejected[0].column.as_deref(), Some("kwargs"));
    assert_eq!(r.rejected[0].row, 3);

    let r = read("verl_mixed.jsonl");
    let (_, code) = rl(&r.accepted[0]);
    assert_eq!(
        code["tests"],
        json!([{"stdin": "3\n", "stdout": "9\n"}, {"stdin": "5\n", "stdout": "25\n"}])
    );
    assert_eq!(code["domain"], "code");
    let (_, math) = rl(&r.accepted[1]);
    assert_eq!(
        (math["answer"].as_str(), math["domain"].as_str()),
        (Some("4"), Some("math"))
    );
    assert_eq!(r.rejected[0].column.as_deref(), Some("data_source"));
    assert!(r.rejected[0].reason.contains("--domain"));
    // Naming the domain settles the row the data_source could not (and overrides the others:
    // the user said every row is math).
    let r = read_spec(DataSpec {
        path: fixture("verl_mixed.jsonl"),
        domain: Some(StageKind::Math),
        ..DataSpec::default()
    });
    assert_eq!((r.accepted.len(), r.rejected.len()), (3, 0));
    assert_eq!(rl(&r.accepted[2]).1["answer"], "x");
    assert_eq!(rl(&r.accepted[2]).1["domain"], "math");

    let r = read("aime_2025.jsonl");
    assert_eq!(rl(&r.accepted[1]).1["answer"], "588");
    let r = read("ifeval_input_data.jsonl");
    assert_eq!(rl(&r.accepted[0]).1["source_id"], 1000);
    assert_eq!(rl(&r.accepted[0]).0, [Message::user(
        "Write a 300+ word summary of the wikipedia page ... Do not use any commas and highlight at least 3 sections that has titles in markdown format."
    )]);
}

#[test]
fn code_presets_decode_their_tests() {
    let r = read("livecodebench.jsonl");
    let (msgs, reference) = rl(&r.accepted[0]);
    assert!(
        msgs[0].content.contains("Read the inputs from stdin"),
        "{}",
        msgs[0].content
    );
    assert_eq!(
        reference["tests"].as_array().unwrap().len(),
        3,
        "public + the decoded private blob"
    );
    assert_eq!(
        reference["tests"][1],
        json!({"stdin": "3\n1 2 3\n", "stdout": "6\n"})
    );
    assert_eq!(reference["stdout_compare"], "lcb");
    // The LeetCode row has only call-based ("functional") tests: a function name, the calls
    // and the starter code, shown in the prompt.
    let (msgs, calls) = rl(&r.accepted[1]);
    assert_eq!(calls["fn_name"], "twoSum");
    assert_eq!(
        calls["call_tests"][0],
        json!({"input": "[2,7,11,15]\n9", "output": "[0, 1]"})
    );
    assert!(
        msgs[0].content.contains("class Solution"),
        "{}",
        msgs[0].content
    );
    assert_eq!(r.rejected[0].column.as_deref(), Some("private_test_cases"));
    assert!(
        r.rejected[0].reason.contains("more than a string"),
        "{}",
        r.rejected[0]
    );
    // Contest-date filter: only the 2025 problem stays.
    let r = read_spec(DataSpec {
        path: fixture("livecodebench.jsonl"),
        since: Some("2024-01-01".into()),
        ..DataSpec::default()
    });
    assert_eq!(
        (r.accepted.len(), r.rejected.len(), r.skipped.len()),
        (1, 0, 3)
    );

    let r = read("apps.jsonl");
    assert_eq!(
        rl(&r.accepted[0]).1["tests"][1],
        json!({"stdin": "10 20\n", "stdout": "30\n"})
    );
    assert_eq!(rl(&r.accepted[1]).1["fn_name"], "square");
    assert_eq!(
        rl(&r.accepted[1]).1["call_tests"][1],
        json!({"input": [3], "output": [9]})
    );
    let r = read("code_contests.parquet");
    assert_eq!(rl(&r.accepted[0]).1["tests"].as_array().unwrap().len(), 3);
    assert_eq!(r.rejected[0].column.as_deref(), Some("public_tests"));
}

#[test]
fn swe_presets_take_the_gold_patch_and_swe_smith_reverses_its_bug() {
    let bench = read("swe_bench.parquet");
    let smith = read("swe_smith.jsonl");
    let gold = rl(&bench.accepted[0]).1["gold_patch"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        rl(&smith.accepted[0]).1["gold_patch"].as_str().unwrap(),
        gold
    );
    assert_eq!(
        rl(&bench.accepted[0]).1["FAIL_TO_PASS"],
        "[\"tests/test_calc.py::test_mean\"]"
    );
    assert_eq!(smith.rejected[0].column.as_deref(), Some("patch"));
    assert_eq!(
        smith.rejected[1].column.as_deref(),
        Some("problem_statement")
    );
}

#[test]
fn pairs_from_every_layout() {
    let r = read("helpsteer3.jsonl");
    let pairs: Vec<_> = r
        .accepted
        .iter()
        .map(|row| match row {
            Row::Pair(p) => p.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(pairs[0].chosen, "Fresh from our oven to your table.");
    assert_eq!(pairs[1].chosen, "Use `xs[::-1]` or `xs.reverse()`.");
    assert!(r.skipped[0].reason.contains("tie"));
    assert!(r.rejected[0].reason.contains("3-turn"), "{}", r.rejected[0]);
    let r = read("skywork_preference.parquet");
    match &r.accepted[1] {
        Row::Pair(p) => assert_eq!(
            (p.prompt.as_str(), p.chosen.as_str(), p.rejected.as_str()),
            ("Translate 'cat' to French.", "chat", "chien")
        ),
        other => panic!("{other:?}"),
    }
    assert!(read("trl_pairs_implicit.jsonl").rejected[0]
        .reason
        .contains("differs"));
}

#[test]
fn bad_files_are_clear_errors() {
    let e = DataReader::open(&DataSpec {
        path: fixture("truncated.parquet"),
        ..DataSpec::default()
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("truncated.parquet") && e.contains("not a readable Parquet file"),
        "{e}"
    );

    let e = DataReader::open(&DataSpec {
        path: fixture("ambiguous_swe.jsonl"),
        ..DataSpec::default()
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("ambiguous")
            && e.contains("swe-bench")
            && e.contains("swe-smith")
            && e.contains("image_name"),
        "{e}"
    );

    // The wrong kind for a preset, and a domain the preset does not give.
    let e = DataReader::open(&DataSpec {
        path: fixture("aime_2025.jsonl"),
        kind: Some(Kind::Sft),
        ..DataSpec::default()
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("no built-in schema for sft data"), "{e}");
    let e = DataReader::open(&DataSpec {
        path: fixture("aime_2025.jsonl"),
        domain: Some(StageKind::Code),
        ..DataSpec::default()
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("math prompts, not code"), "{e}");

    // Every row rejected: validate() stops with the first reasons.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.jsonl");
    std::fs::write(&p, "{\"problem\": \"a\", \"answer\": null}\nnot json\n").unwrap();
    let reader = DataReader::open(&DataSpec {
        path: p.display().to_string(),
        schema: Some(Schema::Preset(Preset::NemotronMath)),
        ..DataSpec::default()
    })
    .unwrap();
    let e = reader.validate().unwrap_err().to_string();
    assert!(
        e.contains("all 2 rows rejected")
            && e.contains("bad.jsonl:1: column `answer`")
            && e.contains("bad.jsonl:2:"),
        "{e}"
    );
}

#[test]
fn explicit_mappings_reach_nested_and_json_columns() {
    let spec = DataSpec {
        path: fixture("verl_gsm8k.parquet"),
        schema: Some(
            Schema::parse("messages=prompt,answer=reward_model.ground_truth,source=data_source")
                .unwrap(),
        ),
        domain: Some(StageKind::Math),
        ..DataSpec::default()
    };
    let r = read_spec(spec);
    assert_eq!((r.accepted.len(), r.rejected.len()), (2, 1));
    let (msgs, reference) = rl(&r.accepted[0]);
    assert!(msgs[0].content.starts_with("Natalia"));
    assert_eq!(reference["answer"], "72");
    assert_eq!(reference["source"], "openai/gsm8k");
    assert!(r.rejected[0].reason.contains("answer"), "{}", r.rejected[0]);

    let spec = DataSpec {
        path: fixture("apps.jsonl"),
        schema: Some(Schema::parse("prompt=question,io=json:input_output").unwrap()),
        ..DataSpec::default()
    };
    let r = read_spec(spec);
    assert_eq!(
        rl(&r.accepted[0]).1["io"]["outputs"],
        json!(["3\n", "30\n"])
    );
    // The third row's input_output is an empty string: not JSON.
    assert_eq!(r.rejected[0].column.as_deref(), Some("json:input_output"));
}

#[test]
fn parquet_row_groups_index_random_access_and_shards() {
    let reader = DataReader::open(&DataSpec {
        path: fixture("row_groups.parquet"),
        ..DataSpec::default()
    })
    .unwrap();
    assert_eq!(reader.len(), 1000);
    match &reader.files()[0] {
        cascade_shared::data::RawFile::Parquet(p) => assert_eq!(p.row_groups(), 16),
        other => panic!("{other:?}"),
    }
    for i in [0u64, 63, 64, 65, 500, 999] {
        let (msgs, reference) = match reader.get(i).unwrap() {
            Row::Rl(r) => (r.messages, r.reference),
            other => panic!("{other:?}"),
        };
        assert_eq!(msgs[0].content, format!("What is {i} + {i}?"));
        assert_eq!(reference["answer"], (2 * i).to_string());
    }
    let ids: Vec<u64> = reader
        .rows_from(990)
        .unwrap()
        .map(|r| r.unwrap().index)
        .collect();
    assert_eq!(ids, (990..1000).collect::<Vec<_>>());
    let mut covered = 0;
    for s in 0..3 {
        let range = reader.shard_range(s, 3);
        covered += reader.rows_in(range).unwrap().count();
    }
    assert_eq!(covered, 1000);
    assert!(reader.get(1000).is_err());
}

#[test]
fn a_directory_or_glob_of_shards_reads_as_one_dataset() {
    let dir = tempfile::tempdir().unwrap();
    for (name, rows) in [("b.jsonl", 3), ("a.jsonl", 2)] {
        let text: String = (0..rows)
            .map(|i| format!("{{\"problem\": \"{name} {i}\", \"answer\": \"{i}\"}}\n"))
            .collect();
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    std::fs::write(dir.path().join("notes.txt"), "not data").unwrap();
    for path in [
        dir.path().display().to_string(),
        format!("{}/*.jsonl", dir.path().display()),
    ] {
        let reader = DataReader::open(&DataSpec {
            path,
            ..DataSpec::default()
        })
        .unwrap();
        assert_eq!(reader.len(), 5);
        let (msgs, reference) = match reader.get(2).unwrap() {
            Row::Rl(r) => (r.messages, r.reference),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            (msgs[0].content.as_str(), reference["answer"].as_str()),
            ("b.jsonl 0", Some("0"))
        );
        let ids: Vec<u64> = reader
            .rows_from(1)
            .unwrap()
            .map(|r| match r.unwrap().outcome {
                Outcome::Accepted(Row::Rl(r)) => r.id,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(ids, [1, 2, 3, 4]);
    }
}
