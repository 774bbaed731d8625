//! Sandboxed code verification: Python programs checked against stdin/stdout cases or
//! HumanEval-style `check(candidate)` tests; reward 1 only when every test passes.

pub mod extract;
pub mod isolation;
pub mod landlock;
pub mod sandbox;
pub mod verifier;

pub use extract::{extract_code, tokens_match};
pub use isolation::Isolation;
pub use sandbox::{Job, RunOutput, Sandbox, SandboxConfig};
pub use verifier::{CodeConfig, CodeVerifier};
