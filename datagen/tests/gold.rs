//! Gold responses score 1.0 with the real verifiers of `cascade-rewards`, in both modes, for every
//! held-out line (read back from the written files) and a sample of training and SFT lines; and
//! deliberately wrong answers score below 1.

use std::path::Path;

use cascade_datagen::code::FnSpec;
use cascade_datagen::common::{stream, Purpose};
use cascade_datagen::{generate, write_tiny, Domain, Mode, Task, TinyData, TinySizes};
use cascade_rewards::code::CodeConfig;
use cascade_rewards::swe::{LexicalFallback, TestScorer};
use cascade_rewards::{CodeVerifier, IfEvalVerifier, MathVerifier, SweVerifier, Verifier};
use cascade_shared::chat::split_response;
use serde_json::Value;

fn verifier(d: Domain) -> Option<Box<dyn Verifier>> {
    match d {
        Domain::Rlhf => None,
        Domain::If => Some(Box::new(IfEvalVerifier::default())),
        Domain::Math => Some(Box::new(MathVerifier::default())),
        // The test scorer runs the row's check on the patched file (what the tiny default
        // uses); without a sandbox the semantic score is the lexical ratio.
        Domain::Swe => match CodeVerifier::new(CodeConfig::default()) {
            Ok(_) => Some(Box::new(SweVerifier::new(Box::new(TestScorer::new(
                CodeConfig::default(),
                Box::new(LexicalFallback),
            ))))),
            Err(e) => {
                eprintln!("SKIPPED SWE test scoring: the sandbox cannot run here: {e}");
                Some(Box::new(SweVerifier::default()))
            }
        },
        Domain::Code => match CodeVerifier::new(CodeConfig::default()) {
            Ok(v) => Some(Box::new(v)),
            Err(e) => {
                eprintln!("SKIPPED code verification: the sandbox cannot run here: {e}");
                None
            }
        },
    }
}

fn score(v: &dyn Verifier, reference: &Value, response: &str) -> f32 {
    let r = v
        .verify(reference, &split_response(response))
        .unwrap_or_else(|e| panic!("reference error {e} for {reference}"));
    r.reward
}

fn file_lines(dir: &Path, name: &str) -> Vec<Value> {
    std::fs::read_to_string(dir.join(name))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A wrong answer for `task` that should not score 1.
fn wrong_answer(task: &Task) -> String {
    match task.domain {
        Domain::Rlhf => unreachable!(),
        Domain::Math => {
            let n: i64 = task.reference["answer"].as_str().unwrap().parse().unwrap();
            format!("\\boxed{{{}}}", n + 1)
        }
        // Mixed case, commas, no quotes or title, no keyword or end phrase, 20 words.
        Domain::If => {
            "Well, HELLO there, I have NO idea what to say, sorry about that, my friend, \
                       it is hard to tell, truly."
                .to_string()
        }
        Domain::Code => {
            let (head, _) = task.answer.split_once("return ").unwrap();
            format!("{head}return None\n```")
        }
        Domain::Swe => {
            let (head, _) = task.answer.split_once("+    return ").unwrap();
            format!("{head}+    return None\n```")
        }
    }
}

/// Checks `tasks` against the reference objects `refs` (the parsed file lines, or the in-memory
/// lines for SFT rows).
fn check(v: &dyn Verifier, tasks: &[(&Task, Value)], what: &str) {
    for (task, reference) in tasks {
        assert_eq!(reference["prompt"].as_str(), Some(task.prompt.as_str()));
        for mode in [Mode::Think, Mode::NoThink] {
            let response = task.response(mode);
            let r = score(v, reference, &response);
            assert_eq!(
                r, 1.0,
                "{what}: gold {response:?} scored {r} on {reference}"
            );
        }
        let wrong = wrong_answer(task);
        let r = score(v, reference, &wrong);
        assert!(r < 1.0, "{what}: wrong {wrong:?} scored {r} on {reference}");
        // A thinking response that never closes its block has no final answer.
        let unclosed = format!("<think>\n{}", task.answer);
        assert!(
            score(v, reference, &unclosed) < 1.0,
            "{what}: unclosed think scored 1"
        );
    }
}

fn run_domain(d: Domain, dir: &Path, data: &TinyData) {
    let Some(v) = verifier(d) else { return };
    let v = v.as_ref();
    let held = file_lines(dir, &format!("{}-heldout.jsonl", d.name()));
    let pairs: Vec<(&Task, Value)> = data.heldout[&d].iter().zip(held).collect();
    assert_eq!(pairs.len(), data.heldout[&d].len());
    check(v, &pairs, &format!("{}-heldout", d.name()));

    let train = file_lines(dir, &format!("{}.jsonl", d.name()));
    let pairs: Vec<(&Task, Value)> = data.train[&d].iter().zip(train).step_by(10).collect();
    check(v, &pairs, d.name());

    let sft: Vec<(&Task, Value)> = data
        .sft
        .iter()
        .filter(|r| r.task.domain == d)
        .step_by(20)
        .map(|r| (&r.task, r.task.line(0)))
        .collect();
    check(v, &sft, &format!("sft/{}", d.name()));
}

fn dataset() -> (tempfile::TempDir, TinyData) {
    let dir = tempfile::tempdir().unwrap();
    let sizes = TinySizes::default();
    write_tiny(dir.path(), 0, &sizes).unwrap();
    (dir, generate(0, &sizes).unwrap())
}

#[test]
fn math_gold_scores_one() {
    let (dir, data) = dataset();
    run_domain(Domain::Math, dir.path(), &data);
}

#[test]
fn if_gold_scores_one() {
    let (dir, data) = dataset();
    run_domain(Domain::If, dir.path(), &data);
}

#[test]
fn swe_gold_scores_one() {
    let (dir, data) = dataset();
    run_domain(Domain::Swe, dir.path(), &data);
}

#[test]
fn code_gold_scores_one() {
    let (dir, data) = dataset();
    run_domain(Domain::Code, dir.path(), &data);
}

/// Every instruction-following shape the generator can make: many seeds' worth of draws (the
/// IFEval case checks depend on a language detector, so this covers every topic in every case).
#[test]
fn if_gold_scores_one_on_many_draws() {
    let v = IfEvalVerifier::default();
    let mut rng = stream(12345, Domain::If, Purpose::Train);
    for _ in 0..5000 {
        let task = Domain::If.sample(&mut rng);
        let reference = task.line(0);
        let r = score(&v, &reference, &task.answer);
        assert_eq!(r, 1.0, "gold {:?} scored {r} on {reference}", task.answer);
    }
}

/// The bugs of the SWE files (mutations of the code expressions) really fail the code tests.
#[test]
fn bug_expressions_fail_the_tests() {
    let Some(v) = verifier(Domain::Code) else {
        return;
    };
    let mut rng = stream(99, Domain::Code, Purpose::Train);
    for _ in 0..25 {
        let spec = FnSpec::sample(&mut rng);
        let reference = serde_json::json!({
            "test_code": spec.test_code(),
            "entry_point": spec.name,
        });
        let gold = format!("```python\n{}```", spec.source(&spec.expr()));
        assert_eq!(score(v.as_ref(), &reference, &gold), 1.0, "{gold}");
        for bug in spec.bugs() {
            let answer = format!("```python\n{}```", spec.source(&bug));
            assert_eq!(score(v.as_ref(), &reference, &answer), 0.0, "{answer}");
        }
    }
}

/// Near-miss patches (a different return line) score below 1 and an unparsable one −1; with the
/// test scorer (the row's repository and check) a near miss that fixes nothing scores 0, where
/// the lexical ratio gives it more than 0.9, and a patch writing the gold expression
/// differently (`x + 3` as `(x) + 3`) scores 1.
#[test]
fn swe_near_misses_score_below_one() {
    let lexical = SweVerifier::default();
    let tests = verifier(Domain::Swe).unwrap();
    let sandbox = CodeVerifier::new(CodeConfig::default()).is_ok();
    let data = generate(5, &TinySizes::default()).unwrap();
    for task in data.heldout[&Domain::Swe].iter() {
        let reference = task.line(0);
        let gold = task.reference["gold_patch"].as_str().unwrap();
        let fixed_line = gold.lines().last().unwrap();
        let buggy_line = gold.lines().nth(3).unwrap();
        let keep_bug = gold.replace(fixed_line, &format!("+{}", &buggy_line[1..]));
        let keep_bug = format!("```diff\n{keep_bug}```");
        let r = score(&lexical, &reference, &keep_bug);
        assert!(r < 1.0 && r > 0.5, "{keep_bug}: {r}");
        for v in [&lexical as &dyn Verifier, tests.as_ref()] {
            assert_eq!(score(v, &reference, "```diff\nnot a diff\n```"), -1.0);
            assert_eq!(score(v, &reference, ""), 0.0);
        }
        if sandbox {
            assert_eq!(
                score(tests.as_ref(), &reference, &keep_bug),
                0.0,
                "{keep_bug}"
            );
            let expr = fixed_line.trim_start_matches("+    return ");
            let same = gold.replace(fixed_line, &format!("+    return ({expr})"));
            assert_eq!(score(tests.as_ref(), &reference, &same), 1.0, "{same}");
        }
    }
}
