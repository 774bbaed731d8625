//! Tokenizer loading and the tiny byte-level tokenizer of the embedded default.
