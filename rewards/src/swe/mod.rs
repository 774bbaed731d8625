//! Execution-free SWE patch reward (as in SWE-RL): parse the unified diff, compare it with the
//! gold patch lexically, and fall back to a pluggable semantic scorer.

pub mod diff;
pub mod scorer;
pub mod similarity;
pub mod verifier;

pub use diff::{parse as parse_diff, DiffError, FilePatch, Hunk, Patch};
pub use scorer::{LexicalFallback, PatchPair, SemanticScore, SemanticScorer};
pub use similarity::{ratio, str_ratio};
pub use verifier::{extract_patch, lexical_similarity, SweVerifier};
