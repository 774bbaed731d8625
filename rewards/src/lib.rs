//! cascade-rewards: one verifier per cascade stage (math, instruction following, sandboxed code,
//! SWE patches), each usable alone. Verifiers see a response already split into thinking and
//! final answer by the chat format ([`cascade_shared::chat::split_response`]); the
//! reward-model verifier, which needs the model, lives in the actor crate and implements the
//! same [`Verifier`] trait.
#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod code;
pub mod ifeval;
pub mod math;
pub mod response;
pub mod score;
pub mod swe;

pub use cascade_shared::chat::SplitResponse;
pub use code::CodeVerifier;
pub use ifeval::IfEvalVerifier;
pub use math::MathVerifier;
pub use score::Scorer;
pub use swe::SweVerifier;

/// The result of verifying one response.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Reward {
    /// The scalar reward used for the GRPO advantage.
    pub reward: f32,
    /// A per-verifier breakdown and diagnostics (e.g. extracted answer, tests passed).
    pub details: serde_json::Value,
}

/// Checks a response against a prompt's reference data.
///
/// `reference` is the JSON object of the dataset line (the domain's reference fields, e.g.
/// `answer` for math, `instruction_id_list` + `kwargs` for IF, `tests` for code, `gold_patch`
/// for SWE). Verifiers look at the final answer only (`response.answer`); a response without
/// `</think>` in thinking mode has no final answer and must score as a failure.
pub trait Verifier: Send + Sync {
    /// Short name used in reward breakdowns and metrics (`"math"`, `"if"`, ...).
    fn name(&self) -> &'static str;

    /// Scores one response. An `Err` means the reference data is malformed (a dataset bug),
    /// not that the response is wrong: a wrong response is `Ok` with a low reward.
    fn verify(
        &self,
        reference: &serde_json::Value,
        response: &SplitResponse<'_>,
    ) -> Result<Reward, VerifyError>;
}

/// Errors about the reference data or the verifier's environment.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// A required reference field is missing or has the wrong type.
    #[error("reference field `{field}`: {problem}")]
    BadReference {
        /// The field name.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The verifier could not run (sandbox set-up failed, interpreter missing, ...).
    #[error("verifier environment: {0}")]
    Environment(String),
}
