//! Sandboxed code verification: Python programs checked against stdin/stdout cases, call-based
//! cases (a function name, arguments and the expected return value) or HumanEval-style
//! `check(candidate)` tests; reward 1 only when every test passes.

pub mod extract;
pub mod isolation;
pub mod landlock;
pub mod sandbox;
pub mod verifier;

pub use extract::{apps_match, extract_code, lcb_match, tokens_match, StdoutCompare};
pub use isolation::Isolation;
pub use sandbox::{Job, RunOutput, Sandbox, SandboxConfig};
pub use verifier::{CodeConfig, CodeVerifier};
