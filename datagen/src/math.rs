//! Arithmetic: one `+`, `-` or `×` on small numbers, as a bare question ("What is 3 + 4?") or a
//! one-sentence word problem. Reference `answer` is the number as a string; the gold answer is
//! `\boxed{n}` and the thinking is the equation (`3+4=7`).

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde_json::{Map, Value};

use crate::common::{pick, short_prompt, Domain, Task};

const NAMES: [&str; 12] = [
    "Tom", "Ann", "Bob", "Sue", "Max", "Eva", "Sam", "Lia", "Ben", "Zoe", "Kim", "Leo",
];

const ITEMS: [&str; 12] = [
    "apples", "pens", "cards", "eggs", "coins", "books", "cups", "toys", "balls", "shells",
    "stamps", "beads",
];

/// Draws one math task.
pub fn sample(rng: &mut ChaCha8Rng) -> Task {
    short_prompt(rng, sample_any)
}

fn sample_any(rng: &mut ChaCha8Rng) -> Task {
    let name = *pick(rng, &NAMES);
    let item = *pick(rng, &ITEMS);
    let op = rng.random_range(0..3);
    let (a, b, c, sym) = match op {
        0 => {
            let (a, b) = (rng.random_range(1..=9), rng.random_range(1..=9));
            (a, b, a + b, '+')
        }
        1 => {
            let a = rng.random_range(2..=12);
            let b = rng.random_range(1..a);
            (a, b, a - b, '-')
        }
        _ => {
            let (a, b) = (rng.random_range(2..=5), rng.random_range(2..=5));
            (a, b, a * b, '*')
        }
    };
    let prompt = match (op, rng.random_range(0..3)) {
        (0, 0) => format!("What is {a} + {b}?"),
        (0, 1) => format!("{name} has {a} {item} and gets {b} more. How many {item} now?"),
        (0, _) => format!("{name} had {a} {item} and found {b} more. How many in all?"),
        (1, 0) => format!("What is {a} - {b}?"),
        (1, 1) => format!("{name} has {a} {item} and loses {b}. How many are left?"),
        (1, _) => format!("{name} had {a} {item} and gave away {b}. How many are left?"),
        (_, 0) => format!("What is {a} times {b}?"),
        (_, 1) => format!("{name} has {a} bags of {b} {item}. How many {item}?"),
        (_, _) => format!("{name} buys {a} boxes with {b} {item} each. How many {item}?"),
    };
    let mut reference = Map::new();
    reference.insert("answer".into(), Value::from(c.to_string()));
    Task {
        domain: Domain::Math,
        prompt,
        reference,
        reasoning: format!("{a}{sym}{b}={c}"),
        answer: format!("\\boxed{{{c}}}"),
    }
}
