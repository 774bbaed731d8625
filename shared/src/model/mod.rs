//! Qwen3-family causal language models (Qwen3, Qwen2, Llama) in candle.
