use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use cascade_report::{read_metrics, write_report, EventKind, ReportOptions};
use serde_json::json;

const T0: f64 = 1000.0;

struct Synth {
    lines: Vec<String>,
    malformed_line: usize,
    lags: Vec<u64>,
}

impl Synth {
    fn push(&mut self, v: serde_json::Value) {
        self.lines.push(v.to_string());
    }
}

/// A run: RM training, an SFT stage (steps 1..=10), two RL stages
/// (`stage1-math` steps 11..=60, `stage2-code` steps 61..=110), two actors,
/// a killed and restarted actor, one malformed line, unknown events/fields.
fn synth_run(dir: &Path, math_stage_name: &str) -> Synth {
    let mut s = Synth {
        lines: Vec::new(),
        malformed_line: 0,
        lags: Vec::new(),
    };
    s.push(json!({"t": T0, "proc": "supervisor", "event": "run_start",
        "config": "configs/tiny.toml", "max_staleness": 2, "actors": 2}));
    for name in ["learner", "actor-0", "actor-1"] {
        s.push(
            json!({"t": T0 + 0.1, "proc": "supervisor", "event": "process",
            "what": "start", "name": name, "pid": 100}),
        );
    }
    s.push(json!({"t": T0 + 0.2, "proc": "learner", "event": "heartbeat", "x": {"y": 1}}));
    for i in 1..=20u64 {
        s.push(json!({"t": T0 + 0.2 + i as f64 * 0.01, "proc": "learner", "event": "rm_step",
            "step": i, "steps": 20, "loss": 0.7 - i as f64 * 0.01, "accuracy": 0.5 + i as f64 * 0.01}));
    }
    s.push(json!({"t": T0 + 0.5, "proc": "learner", "event": "rm_done",
        "heldout_accuracy": 0.71, "pairs": 64}));
    for step in 1..=10u64 {
        s.push(
            json!({"t": T0 + step as f64, "proc": "learner", "event": "sft_step",
            "stage": "sft", "stage_index": 0, "stage_step": step, "stage_steps": 10, "step": step,
            "loss": 2.0 / step as f64, "lr": 1e-5, "grad_norm": 1.0, "train_tokens": 4096,
            "tokens_per_s": 9000.0, "step_s": 1.0}),
        );
    }
    s.push(
        json!({"t": T0 + 10.5, "proc": "learner", "event": "stage_end",
        "stage": "sft", "stage_index": 0, "step": 10, "policy_version": 10}),
    );
    for step in 11..=110u64 {
        let (stage, kind, idx, idle, first) = if step <= 60 {
            (math_stage_name, "math", 1, 0.5, 11)
        } else {
            ("stage2-code", "code", 2, 0.25, 61)
        };
        let t = T0 + 10.0 + (step - 10) as f64 * 2.0;
        let lag = vec![step % 3, (step + 1) % 3];
        s.lags.extend(&lag);
        let mut by_mode = json!({"think": {"groups": 2, "reward_mean": 0.3 + step as f64 * 0.001,
            "pass_rate": 0.4, "response_len": 900.0 + step as f64}});
        if step % 4 != 0 {
            by_mode["no_think"] = json!({"groups": 2, "reward_mean": 0.2, "pass_rate": 0.3,
                "response_len": 200.0});
        }
        s.push(json!({"t": t, "proc": "learner", "event": "learner_step",
            "stage": stage, "stage_kind": kind, "stage_index": idx, "stage_step": step - first + 1,
            "stage_steps": 50, "step": step, "policy_version": step, "loss": 0.1, "grad_norm": 0.5,
            "lr": 1e-6, "train_tokens": 8000, "tokens_per_s": 4000.0, "step_s": 2.0, "idle_s": idle,
            "reward_mean": 0.25, "by_mode": by_mode, "policy_lag": lag, "groups_kept": 4,
            "dropped": {"stale": if idx == 1 { 1 } else { 0 }, "equal_rewards": 2, "bad_input": 0},
            "queue_depth": 3, "skipped": false, "future_field": "ignored"}));
        if step == 60 {
            s.push(
                json!({"t": t + 0.1, "proc": "learner", "event": "stage_end",
                "stage": math_stage_name, "stage_index": 1, "step": 60, "policy_version": 60}),
            );
        }
        if step % 2 == 0 {
            for a in 0..2u64 {
                s.push(
                    json!({"t": t + 0.3, "proc": format!("actor-{a}"), "event": "actor",
                    "actor": a, "stage": stage, "policy_version": step - 1, "groups": step * 2,
                    "tokens": step * 1000, "tokens_per_s": 1500.0 + a as f64 * 100.0}),
                );
            }
        }
        if step == 40 {
            s.lines
                .push("{\"t\": 1090.0, \"proc\": \"actor-1\", \"event\": \"act".to_string());
            s.malformed_line = s.lines.len();
            s.push(json!({"t": t + 0.5, "proc": "supervisor", "event": "process",
                "what": "exit", "name": "actor-1", "pid": 100, "status": "killed by signal 9", "restarts": 0}));
            s.push(
                json!({"t": t + 0.6, "proc": "supervisor", "event": "process",
                "what": "restart", "name": "actor-1", "pid": 101, "restarts": 1}),
            );
        }
    }
    s.push(
        json!({"t": T0 + 210.5, "proc": "learner", "event": "stage_end",
        "stage": "stage2-code", "stage_index": 2, "step": 110, "policy_version": 110}),
    );
    s.push(
        json!({"t": T0 + 251.0, "proc": "supervisor", "event": "run_end",
        "wall_s": 250.0, "status": "completed", "max_staleness": 2}),
    );

    let mut text = s.lines.join("\n");
    text.push('\n');
    fs::write(dir.join("metrics.jsonl"), text).unwrap();
    fs::write(
        dir.join("heldout.json"),
        json!({"domains": ["rlhf", "if", "math", "code", "swe"], "rows": [
            {"after_stage": "sft", "scores": {"rlhf": 0.5, "if": 0.33, "math": 0.41, "code": 0.2, "swe": 0.05}},
            {"after_stage": math_stage_name, "scores": {"rlhf": 0.51, "if": 0.3, "math": 0.47, "code": 0.19, "swe": 0.05}},
            {"after_stage": "stage2-code", "scores": {"rlhf": 0.5, "if": 0.31, "math": 0.45, "code": 0.18, "swe": 0.06}}
        ], "gains": [
            {"stage": math_stage_name, "domain": "math", "before": 0.41, "after": 0.47, "diff": 0.06, "se": 0.021, "prompts": 96}
        ]})
        .to_string(),
    )
    .unwrap();
    s
}

/// On-policy baseline: no run_end, so wall = last t − first t = 625.5.
fn synth_baseline(dir: &Path) {
    let mut text = String::new();
    writeln!(
        text,
        "{}",
        json!({"t": 500.0, "proc": "supervisor", "event": "run_start", "max_staleness": 0, "actors": 2})
    )
    .unwrap();
    for step in 1..=50u64 {
        writeln!(
            text,
            "{}",
            json!({"t": 500.0 + step as f64 * 12.0, "proc": "learner",
            "event": "learner_step", "stage": "stage1-math", "stage_kind": "math", "stage_index": 1,
            "step": step, "reward_mean": 0.2 + step as f64 * 0.002, "step_s": 12.0, "idle_s": 9.0,
            "policy_lag": [0, 0]})
        )
        .unwrap();
    }
    writeln!(
        text,
        "{}",
        json!({"t": 1125.5, "proc": "actor-0", "event": "actor", "actor": 0,
        "tokens_per_s": 1000.0})
    )
    .unwrap();
    fs::write(dir.join("metrics.jsonl"), text).unwrap();
}

fn referenced_svgs(html: &str) -> Vec<String> {
    html.split("src=\"")
        .skip(1)
        .map(|rest| rest[..rest.find('"').unwrap()].to_string())
        .collect()
}

fn section<'a>(html: &'a str, id: &str) -> &'a str {
    let start = html
        .find(&format!("<section id=\"{id}\">"))
        .unwrap_or_else(|| panic!("section {id} missing"));
    let end = start + html[start..].find("</section>").unwrap();
    &html[start..end]
}

fn approx(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn full_report_with_compare() {
    let run = tempfile::tempdir().unwrap();
    let base = tempfile::tempdir().unwrap();
    let synth = synth_run(run.path(), "stage1-math");
    synth_baseline(base.path());
    assert!(synth.lines.len() > 200, "{} lines", synth.lines.len());

    let metrics = read_metrics(run.path().join("metrics.jsonl")).unwrap();
    assert_eq!(metrics.malformed, 1);
    assert_eq!(metrics.first_malformed_line, Some(synth.malformed_line));
    assert_eq!(metrics.events.len(), synth.lines.len() - 1);
    assert!(metrics
        .events
        .iter()
        .any(|e| e.kind == EventKind::Other("heartbeat".into())));

    let summary = write_report(
        run.path(),
        &ReportOptions {
            compare: Some(base.path().to_path_buf()),
        },
    )
    .unwrap();
    let index = run.path().join("report/index.html");
    assert_eq!(summary.index_html, index);
    let html = fs::read_to_string(&index).unwrap();

    // Sections.
    for id in [
        "summary",
        "reward",
        "pass-rate",
        "response-length",
        "throughput",
        "policy-lag",
        "idle",
        "dropped",
        "loss",
        "rm",
        "heldout",
        "processes",
        "compare",
    ] {
        section(&html, id);
    }
    assert!(html.contains("Async vs on-policy"));
    assert!(html.contains(&format!(
        "1 malformed line skipped, first at line {}",
        synth.malformed_line
    )));

    // Every referenced SVG exists and is an SVG; every written chart is referenced.
    let svgs = referenced_svgs(&html);
    for name in [
        "reward.svg",
        "pass_rate.svg",
        "response_len.svg",
        "throughput.svg",
        "policy_lag.svg",
        "loss.svg",
        "rm.svg",
        "compare_reward.svg",
    ] {
        assert!(svgs.iter().any(|s| s == name), "{name} not referenced");
    }
    for name in &svgs {
        let text = fs::read_to_string(run.path().join("report").join(name)).unwrap();
        assert!(text.trim_start().starts_with("<svg"), "{name}");
        assert!(text.trim_end().ends_with("</svg>"), "{name}");
    }
    assert_eq!(summary.charts.len(), svgs.len());
    // Both modes and stage labels are drawn on the reward chart.
    let reward_svg = fs::read_to_string(run.path().join("report/reward.svg")).unwrap();
    for label in ["think", "no_think", "stage1-math", "stage2-code"] {
        assert!(reward_svg.contains(label), "{label}");
    }
    let throughput_svg = fs::read_to_string(run.path().join("report/throughput.svg")).unwrap();
    for label in ["learner", "actor-0", "actor-1"] {
        assert!(throughput_svg.contains(label), "{label}");
    }

    // Summary numbers, computed by hand.
    assert_eq!(summary.wall_s, Some(250.0));
    assert_eq!(summary.status.as_deref(), Some("completed"));
    assert_eq!(summary.max_staleness, Some(2));
    assert_eq!(summary.rl_steps, 100);
    assert_eq!(summary.sft_steps, 10);
    assert_eq!(summary.last_step, Some(110));
    assert_eq!(summary.stages, ["sft", "stage1-math", "stage2-code"]);
    // (50 * 0.5 + 50 * 0.25) / (100 * 2.0)
    assert!(approx(summary.idle_fraction.unwrap(), 0.1875));
    assert_eq!(summary.malformed_lines, 1);
    assert_eq!(summary.restarts.get("actor-1"), Some(&1));
    assert_eq!(summary.restarts.get("learner"), Some(&0));
    let lag = summary.policy_lag.clone().unwrap();
    assert_eq!(lag.count, 200);
    assert_eq!(lag.count, synth.lags.len());
    let mean = synth.lags.iter().sum::<u64>() as f64 / synth.lags.len() as f64;
    assert!(approx(lag.mean, mean));
    assert_eq!(lag.max, 2);
    assert_eq!(lag.median, 1);
    assert_eq!(lag.p95, 2);
    let cmp = summary.compare.clone().unwrap();
    assert_eq!(cmp.other_wall_s, Some(625.5));
    assert_eq!(cmp.other_max_staleness, Some(0));
    assert!(approx(cmp.ratio.unwrap(), 625.5 / 250.0));
    let compare = section(&html, "compare");
    assert!(compare.contains("2.502×"));

    // Idle per stage.
    let idle = section(&html, "idle");
    assert!(idle.contains("<td>25.0%</td>"), "{idle}");
    assert!(idle.contains("<td>12.5%</td>"));
    assert!(idle.contains("18.8%"));

    // Dropped per stage: kept 4/step, stale 1/step in math, equal_rewards 2/step.
    let dropped = section(&html, "dropped");
    assert!(dropped.contains(
        "<tr><td class=\"l\">stage1-math</td><td>200</td><td>50</td><td>100</td><td>0</td><td>150</td>"
    ));
    assert!(dropped.contains(
        "<tr><td class=\"l\">stage2-code</td><td>200</td><td>0</td><td>100</td><td>0</td><td>100</td>"
    ));

    // Held-out table cells match the input.
    let heldout = section(&html, "heldout");
    let rows: Vec<&str> = heldout.split("<tr>").skip(2).collect();
    assert_eq!(rows.len(), 3);
    let expected = [
        ("sft", [0.5, 0.33, 0.41, 0.2, 0.05]),
        ("stage1-math", [0.51, 0.3, 0.47, 0.19, 0.05]),
        ("stage2-code", [0.5, 0.31, 0.45, 0.18, 0.06]),
    ];
    for (row, (stage, scores)) in rows.iter().zip(expected) {
        assert!(
            row.starts_with(&format!("<td class=\"l\">{stage}</td>")),
            "{row}"
        );
        for (domain, score) in ["rlhf", "if", "math", "code", "swe"].iter().zip(scores) {
            assert!(
                row.contains(&format!("data-domain=\"{domain}\">{score}</td>")),
                "{stage} {domain} {score}: {row}"
            );
        }
    }
    assert!(!rows[0].contains("class=\"diag\""));
    assert!(rows[1].contains("<td class=\"diag\" data-domain=\"math\">0.47</td>"));
    assert!(rows[1].contains('✓') && !rows[1].contains('✗'));
    assert!(
        rows[1].contains("(paired: +0.060 ± 0.021 s.e.)"),
        "{}",
        rows[1]
    );
    assert!(
        !rows[2].contains("paired"),
        "no gain recorded for the code row"
    );
    assert!(rows[2].contains("<td class=\"diag\" data-domain=\"code\">0.18</td>"));
    assert!(rows[2].contains('✗') && !rows[2].contains('✓'));

    // Restart visible in the processes table.
    assert!(section(&html, "processes").contains("killed by signal 9"));

    // Rerunning without compare drops the compare chart and section.
    let again = write_report(run.path(), &ReportOptions::default()).unwrap();
    assert!(again.compare.is_none());
    assert!(!run.path().join("report/compare_reward.svg").exists());
    let html = fs::read_to_string(&index).unwrap();
    assert!(!html.contains("<section id=\"compare\">"));
}

#[test]
fn missing_metrics_says_so() {
    let run = tempfile::tempdir().unwrap();
    let summary = write_report(run.path(), &ReportOptions::default()).unwrap();
    assert!(!summary.has_metrics);
    assert!(summary.charts.is_empty());
    assert_eq!(summary.wall_s, None);
    assert_eq!(summary.idle_fraction, None);
    let html = fs::read_to_string(run.path().join("report/index.html")).unwrap();
    assert!(html.contains("no metrics"), "{html}");
    assert!(html.contains("No heldout.json"));

    // An empty file and a file of garbage read the same way, plus a comparison
    // against a run that has no metrics either.
    fs::write(run.path().join("metrics.jsonl"), "garbage\n\n").unwrap();
    let other = tempfile::tempdir().unwrap();
    let summary = write_report(
        run.path(),
        &ReportOptions {
            compare: Some(other.path().to_path_buf()),
        },
    )
    .unwrap();
    assert!(!summary.has_metrics);
    assert_eq!(summary.malformed_lines, 1);
    assert_eq!(summary.compare.unwrap().ratio, None);
    let html = fs::read_to_string(run.path().join("report/index.html")).unwrap();
    assert!(html.contains("no metrics"));
    assert!(html.contains("1 malformed line skipped, first at line 1"));
}

#[test]
fn missing_run_dir_is_an_error() {
    let run = tempfile::tempdir().unwrap();
    assert!(write_report(&run.path().join("nope"), &ReportOptions::default()).is_err());
    assert!(read_metrics(run.path().join("nope.jsonl")).is_err());
}

#[test]
fn strings_from_data_are_escaped() {
    let run = tempfile::tempdir().unwrap();
    synth_run(run.path(), "<b>math</b> & \"more\"");
    let summary = write_report(run.path(), &ReportOptions::default()).unwrap();
    assert_eq!(summary.stages[1], "<b>math</b> & \"more\"");
    let html = fs::read_to_string(run.path().join("report/index.html")).unwrap();
    assert!(!html.contains("<b>math"));
    assert!(html.contains("&lt;b&gt;math&lt;/b&gt; &amp; &quot;more&quot;"));
    // Held-out row for that stage still maps to its domain.
    assert!(section(&html, "heldout").contains("<td class=\"diag\" data-domain=\"math\">0.47</td>"));
    for chart in &summary.charts {
        let svg = fs::read_to_string(chart).unwrap();
        assert!(!svg.contains("<b>"), "{}", chart.display());
    }
}
