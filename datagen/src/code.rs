//! Code: one-line Python functions ("Write a Python function f(x) that returns x plus 3."),
//! checked HumanEval-style with `test_code` (a `check(candidate)` of a few asserts) and
//! `entry_point`. The gold answer is a fenced block tagged `python` holding a two-line function;
//! the thinking names the return expression. [`FnSpec`] is shared with the SWE domain, whose
//! bugs are mutations of the same expressions.

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde_json::{Map, Value};

use crate::common::{pick, short_prompt, Domain, Task};

/// The operation of a one-argument affine function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `x + k`
    Plus,
    /// `x - k`
    Minus,
    /// `x * k`
    Times,
}

/// What a generated function computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// `x (op) k`.
    Affine(Op, i64),
    /// `x % 2 == 0`
    Even,
    /// `x % 2 == 1`
    Odd,
    /// `x > 0`
    Positive,
    /// `x < 0`
    Negative,
    /// `x == 0`
    Zero,
    /// `x > k`
    Over(i64),
    /// `x < k`
    Under(i64),
    /// `x * x`
    Square,
    /// `2 * x`
    Double,
    /// `-x`
    Negate,
    /// `a + b`
    Sum,
    /// `a - b`
    Difference,
    /// `a * b`
    Product,
    /// `max(a, b)`
    Larger,
    /// `min(a, b)`
    Smaller,
}

/// A Python value the tests compare with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PyValue {
    /// An `int`.
    Int(i64),
    /// A `bool`.
    Bool(bool),
}

impl std::fmt::Display for PyValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PyValue::Int(i) => write!(f, "{i}"),
            PyValue::Bool(true) => f.write_str("True"),
            PyValue::Bool(false) => f.write_str("False"),
        }
    }
}

/// A function to write (or to fix): name, parameters, what it returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FnSpec {
    /// The function name (the test's `entry_point`).
    pub name: String,
    /// Parameter names (one or two).
    pub params: Vec<&'static str>,
    /// What it computes.
    pub body: Body,
}

const FN_NAME: &str = "f";
const UNARY_PARAM: &str = "x";
const BINARY_PARAMS: (&str, &str) = ("a", "b");
const UNARY_INPUTS: [i64; 6] = [0, 1, 4, -3, 7, 10];
const BINARY_INPUTS: [(i64, i64); 4] = [(2, 5), (7, 3), (-1, -4), (0, 6)];

impl FnSpec {
    /// Draws a function.
    pub fn sample(rng: &mut ChaCha8Rng) -> FnSpec {
        let roll = rng.random_range(0..100);
        let body = if roll < 45 {
            match rng.random_range(0..3) {
                0 => Body::Affine(Op::Plus, rng.random_range(1..=19)),
                1 => Body::Affine(Op::Minus, rng.random_range(1..=19)),
                _ => Body::Affine(Op::Times, rng.random_range(2..=9)),
            }
        } else if roll < 70 {
            match rng.random_range(0..7) {
                0 => Body::Even,
                1 => Body::Odd,
                2 => Body::Positive,
                3 => Body::Negative,
                4 => Body::Zero,
                5 => Body::Over(rng.random_range(1..=6)),
                _ => Body::Under(rng.random_range(1..=6)),
            }
        } else if roll < 80 {
            *pick(rng, &[Body::Square, Body::Double, Body::Negate])
        } else {
            *pick(
                rng,
                &[
                    Body::Sum,
                    Body::Difference,
                    Body::Product,
                    Body::Larger,
                    Body::Smaller,
                ],
            )
        };
        // Every function is `f` with fixed parameters, so writing it means reading what to
        // compute, not copying names: a model of the tiny default's size does not learn to copy
        // arbitrary identifiers in its SFT budget (with names drawn per task, held-out code
        // stayed at 0 % after SFT and gave RL no signal).
        let name = FN_NAME.to_string();
        let params = if body.arity() == 1 {
            vec![UNARY_PARAM]
        } else {
            vec![BINARY_PARAMS.0, BINARY_PARAMS.1]
        };
        FnSpec { name, params, body }
    }

    /// `name(x)` / `name(a, b)`.
    pub fn signature(&self) -> String {
        format!("{}({})", self.name, self.params.join(", "))
    }

    /// The correct return expression.
    pub fn expr(&self) -> String {
        self.body.expr(&self.params)
    }

    /// The words saying what it returns ("x plus 3", "True if n is even").
    pub fn description(&self) -> String {
        let p = self.params[0];
        let q = self.params.get(1).copied().unwrap_or("");
        match self.body {
            Body::Affine(Op::Plus, k) => format!("{p} plus {k}"),
            Body::Affine(Op::Minus, k) => format!("{p} minus {k}"),
            Body::Affine(Op::Times, k) => format!("{p} times {k}"),
            Body::Even => format!("True if {p} is even"),
            Body::Odd => format!("True if {p} is odd"),
            Body::Positive => format!("True if {p} is positive"),
            Body::Negative => format!("True if {p} is negative"),
            Body::Zero => format!("True if {p} is zero"),
            Body::Over(k) => format!("True if {p} is more than {k}"),
            Body::Under(k) => format!("True if {p} is less than {k}"),
            Body::Square => format!("{p} squared"),
            Body::Double => format!("twice {p}"),
            Body::Negate => format!("minus {p}"),
            Body::Sum => format!("the sum of {p} and {q}"),
            Body::Difference => format!("{p} minus {q}"),
            Body::Product => format!("the product of {p} and {q}"),
            Body::Larger => format!("the larger of {p} and {q}"),
            Body::Smaller => format!("the smaller of {p} and {q}"),
        }
    }

    /// The two-line definition returning `expr`.
    pub fn source(&self, expr: &str) -> String {
        format!("def {}:\n    return {expr}\n", self.signature())
    }

    /// HumanEval-style `check(candidate)` over fixed inputs.
    pub fn test_code(&self) -> String {
        let mut s = String::from("def check(candidate):\n");
        if self.body.arity() == 1 {
            for x in UNARY_INPUTS {
                let y = self.body.eval(x, 0);
                s.push_str(&format!("    assert candidate({x}) == {y}\n"));
            }
        } else {
            for (a, b) in BINARY_INPUTS {
                let y = self.body.eval(a, b);
                s.push_str(&format!("    assert candidate({a}, {b}) == {y}\n"));
            }
        }
        s
    }

    /// Wrong return expressions a buggy file may contain, each failing at least one test input.
    pub fn bugs(&self) -> Vec<String> {
        let p = self.params[0];
        let q = self.params.get(1).copied().unwrap_or("");
        match self.body {
            Body::Affine(op, k) => {
                let mut out = Vec::new();
                for other in [Op::Plus, Op::Minus, Op::Times] {
                    if other != op && !(other == Op::Times && k == 1) {
                        out.push(Body::Affine(other, k).expr(&self.params));
                    }
                }
                for k2 in [k - 1, k + 1] {
                    if (1..=9).contains(&k2) && !(op == Op::Times && k2 == 1) {
                        out.push(Body::Affine(op, k2).expr(&self.params));
                    }
                }
                out
            }
            Body::Even => vec![format!("{p} % 2 == 1"), format!("{p} % 2 != 0")],
            Body::Odd => vec![format!("{p} % 2 == 0"), format!("{p} % 2 != 1")],
            Body::Positive => vec![format!("{p} < 0"), format!("{p} == 0")],
            Body::Negative => vec![format!("{p} > 0"), format!("{p} == 0")],
            Body::Zero => vec![format!("{p} != 0"), format!("{p} > 0")],
            Body::Over(k) => vec![format!("{p} < {k}"), format!("{p} == {k}")],
            Body::Under(k) => vec![format!("{p} > {k}"), format!("{p} == {k}")],
            Body::Square => vec![format!("{p} + {p}"), format!("{p} * 2")],
            Body::Double => vec![format!("2 + {p}"), format!("{p} * {p}")],
            Body::Negate => vec![p.to_string(), format!("{p} - 1")],
            Body::Sum => vec![format!("{p} - {q}"), format!("{p} * {q}")],
            Body::Difference => vec![format!("{q} - {p}"), format!("{p} + {q}")],
            Body::Product => vec![format!("{p} + {q}"), format!("{p} - {q}")],
            Body::Larger => vec![format!("min({p}, {q})")],
            Body::Smaller => vec![format!("max({p}, {q})")],
        }
    }
}

impl Body {
    /// Number of parameters.
    pub fn arity(self) -> usize {
        match self {
            Body::Sum | Body::Difference | Body::Product | Body::Larger | Body::Smaller => 2,
            _ => 1,
        }
    }

    /// The Python expression over `params`.
    pub fn expr(self, params: &[&str]) -> String {
        let p = params[0];
        let q = params.get(1).copied().unwrap_or("");
        match self {
            Body::Affine(Op::Plus, k) => format!("{p} + {k}"),
            Body::Affine(Op::Minus, k) => format!("{p} - {k}"),
            Body::Affine(Op::Times, k) => format!("{p} * {k}"),
            Body::Even => format!("{p} % 2 == 0"),
            Body::Odd => format!("{p} % 2 == 1"),
            Body::Positive => format!("{p} > 0"),
            Body::Negative => format!("{p} < 0"),
            Body::Zero => format!("{p} == 0"),
            Body::Over(k) => format!("{p} > {k}"),
            Body::Under(k) => format!("{p} < {k}"),
            Body::Square => format!("{p} * {p}"),
            Body::Double => format!("2 * {p}"),
            Body::Negate => format!("-{p}"),
            Body::Sum => format!("{p} + {q}"),
            Body::Difference => format!("{p} - {q}"),
            Body::Product => format!("{p} * {q}"),
            Body::Larger => format!("max({p}, {q})"),
            Body::Smaller => format!("min({p}, {q})"),
        }
    }

    /// The value Python computes (`%` rounds towards negative infinity, as `rem_euclid` by 2).
    pub fn eval(self, x: i64, y: i64) -> PyValue {
        use PyValue::{Bool, Int};
        match self {
            Body::Affine(Op::Plus, k) => Int(x + k),
            Body::Affine(Op::Minus, k) => Int(x - k),
            Body::Affine(Op::Times, k) => Int(x * k),
            Body::Even => Bool(x.rem_euclid(2) == 0),
            Body::Odd => Bool(x.rem_euclid(2) == 1),
            Body::Positive => Bool(x > 0),
            Body::Negative => Bool(x < 0),
            Body::Zero => Bool(x == 0),
            Body::Over(k) => Bool(x > k),
            Body::Under(k) => Bool(x < k),
            Body::Square => Int(x * x),
            Body::Double => Int(2 * x),
            Body::Negate => Int(-x),
            Body::Sum => Int(x + y),
            Body::Difference => Int(x - y),
            Body::Product => Int(x * y),
            Body::Larger => Int(x.max(y)),
            Body::Smaller => Int(x.min(y)),
        }
    }
}

const TEMPLATES: [&str; 10] = [
    "Write a Python function {sig} that returns {desc}.",
    "Define {sig} in Python to return {desc}.",
    "In Python, write {sig} returning {desc}.",
    "Implement {sig} in Python: it returns {desc}.",
    "Python task: {sig} should return {desc}.",
    "Give a Python function {sig} returning {desc}.",
    "Code {sig} in Python so it returns {desc}.",
    "Write {sig} in Python. It returns {desc}.",
    "Make a Python function {sig} that gives {desc}.",
    "Create {sig} in Python returning {desc}.",
];

/// The gold answer for `spec`: its source in a fence tagged `python`.
pub fn fenced(spec: &FnSpec) -> String {
    format!("```python\n{}```", spec.source(&spec.expr()))
}

/// Draws one code task.
pub fn sample(rng: &mut ChaCha8Rng) -> Task {
    short_prompt(rng, sample_any)
}

fn sample_any(rng: &mut ChaCha8Rng) -> Task {
    let spec = FnSpec::sample(rng);
    let prompt = pick(rng, &TEMPLATES)
        .replace("{sig}", &spec.signature())
        .replace("{desc}", &spec.description());
    let mut reference = Map::new();
    reference.insert("test_code".into(), Value::from(spec.test_code()));
    reference.insert("entry_point".into(), Value::from(spec.name.clone()));
    Task {
        domain: Domain::Code,
        prompt,
        reference,
        reasoning: format!("return {}", spec.expr()),
        answer: fenced(&spec),
    }
}
