//! SWE patch reward (as in SWE-RL): parse the unified diff, compare it with the gold patch
//! lexically, and fall back to a pluggable semantic scorer: a judge model, the row's own tests
//! run on the patched repository ([`TestScorer`], for rows that carry one), or the lexical ratio.

pub mod diff;
pub mod execute;
pub mod scorer;
pub mod similarity;
pub mod verifier;

pub use diff::{parse as parse_diff, ApplyError, DiffError, FilePatch, Hunk, Patch};
pub use execute::{TestScorer, REPO_FIELDS};
pub use scorer::{LexicalFallback, PatchPair, SemanticScore, SemanticScorer};
pub use similarity::{ratio, str_ratio};
pub use verifier::{extract_patch, lexical_similarity, SweVerifier};
