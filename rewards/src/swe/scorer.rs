//! The pluggable semantic scorer used when a patch is neither empty, unparsable nor lexically
//! identical to the gold patch.

use serde_json::Value;

use crate::VerifyError;

/// What a semantic scorer is asked to compare.
#[derive(Debug, Clone, Copy)]
pub struct PatchPair<'a> {
    /// The predicted patch text (as extracted from the answer).
    pub predicted: &'a str,
    /// The gold patch text.
    pub gold: &'a str,
    /// The lexical similarity already computed, in [0, 1).
    pub lexical: f64,
    /// The whole reference line (a judge may want the issue text or the prompt).
    pub reference: &'a Value,
}

/// A semantic score in [0, 1] with its provenance.
#[derive(Debug, Clone, PartialEq)]
pub struct SemanticScore {
    /// The score in [0, 1].
    pub score: f64,
    /// Diagnostics reported in the reward's `details` (which scorer, judge probabilities, ...).
    pub details: Value,
}

/// Scores whether two patches fix the same issue. A judge model (asked for P("YES")) implements
/// this in the crate that owns the model; [`LexicalFallback`] is the default.
pub trait SemanticScorer: Send + Sync {
    /// Short name for reward breakdowns.
    fn name(&self) -> &'static str;

    /// Scores one pair; an `Err` is an environment failure (judge unavailable), not a low score.
    fn score(&self, pair: &PatchPair<'_>) -> Result<SemanticScore, VerifyError>;
}

/// The scorer used without a judge: the lexical ratio itself, saying so in `details`.
#[derive(Debug, Clone, Copy, Default)]
pub struct LexicalFallback;

impl SemanticScorer for LexicalFallback {
    fn name(&self) -> &'static str {
        "lexical-fallback"
    }

    fn score(&self, pair: &PatchPair<'_>) -> Result<SemanticScore, VerifyError> {
        Ok(SemanticScore {
            score: pair.lexical.clamp(0.0, 1.0),
            details: serde_json::json!({
                "scorer": self.name(),
                "note": "no judge model configured: semantic score falls back to the lexical ratio",
            }),
        })
    }
}
