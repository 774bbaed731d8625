#!/usr/bin/env python3
"""Reference logits from Hugging Face transformers for the model tests.

Run:  PY=$(scripts/setup-torch-ref.sh | tail -1); $PY scripts/gen-model-fixtures.py
Writes tests/fixtures/model/<name>/{config.json,model.safetensors,reference.safetensors,cases.json}.

Each model is a tiny random Qwen3 / Qwen2 / Llama built by transformers itself (weights drawn
by torch with a fixed seed; norms and biases perturbed so that they matter), saved as
safetensors (one in bf16 to exercise dtype conversion), and run in float32 by transformers'
own `*ForCausalLM` (eager attention) to produce the expected logits.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_shim  # noqa: F401,E402  (must precede transformers)

import torch  # noqa: E402
from safetensors.torch import save_file, load_file  # noqa: E402
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config, LlamaConfig  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "model")

COMMON = dict(vocab_size=384, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
              rms_norm_eps=1e-6, rope_theta=10000.0)

MODELS = {
    "qwen3-tied": (Qwen3Config, dict(COMMON, head_dim=16, tie_word_embeddings=True), "float32"),
    "qwen3-untied": (Qwen3Config, dict(COMMON, head_dim=8, tie_word_embeddings=False, rope_theta=1e6), "float32"),
    "qwen2-bf16": (Qwen2Config, dict(COMMON, tie_word_embeddings=False, use_sliding_window=False), "bfloat16"),
    "llama": (LlamaConfig, dict(COMMON, tie_word_embeddings=True), "float16"),
}


def build(name, cls, kw, disk_dtype, seed):
    torch.manual_seed(seed)
    cfg = cls(**kw)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", torch_dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif pname.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                # A larger scale than the 0.02 default so attention is far from uniform.
                p.copy_(0.08 * torch.randn_like(p))
    out = os.path.join(ROOT, name)
    os.makedirs(out, exist_ok=True)
    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[disk_dtype]
    state = {k: v.detach().to(dt).contiguous() for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    # Reload what was written (bf16/f16 rounding included) so the reference sees the same weights.
    loaded = {k: v.to(torch.float32) for k, v in load_file(os.path.join(out, "model.safetensors")).items()}
    model.load_state_dict(loaded, strict=False)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    cfg_dict = cfg.to_dict()
    cfg_dict["torch_dtype"] = disk_dtype
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg_dict, f, indent=2, sort_keys=True)
    return model, out


def logits(model, ids, mask=None, pos=None):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()


def main():
    g = torch.Generator().manual_seed(1234)
    for i, (name, (cls, kw, disk_dtype)) in enumerate(MODELS.items()):
        model, out = build(name, cls, kw, disk_dtype, seed=100 + i)
        V = kw["vocab_size"]
        ref = {}
        cases = {}
        # 1. A single prompt.
        a = torch.randint(0, V, (1, 9), generator=g)
        ref["single.logits"] = logits(model, a)[0]
        cases["single"] = a[0].tolist()
        # 2. A left-padded batch of two: row 0 is `b` (5 tokens) padded to 9, row 1 is `a`.
        b = torch.randint(0, V, (1, 5), generator=g)
        cases["short"] = b[0].tolist()
        ref["short.logits"] = logits(model, b)[0]
        # Also the transformers-side padded forward (explicit positions = cumsum(mask) - 1).
        pad = torch.zeros((1, 4), dtype=torch.long)
        batch = torch.cat([torch.cat([pad, b], 1), a], 0)
        mask = torch.cat([torch.cat([torch.zeros(1, 4), torch.ones(1, 5)], 1), torch.ones(1, 9)], 0).long()
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        ref["padded.logits"] = logits(model, batch, mask, pos)
        # 3. Twelve greedy steps (transformers' own KV-cache generate), then the full forward of
        #    prompt + generated tokens, whose logits at each step must equal our cached decode.
        p = torch.randint(0, V, (1, 6), generator=g)
        # (A manual loop over transformers' cache: `generate` imports FSDP, broken on torch 1.13.)
        with torch.no_grad():
            out_ = model(input_ids=p, use_cache=True)
            past, toks = out_.past_key_values, []
            for step in range(12):
                nxt = out_.logits[0, -1].argmax().view(1, 1)
                toks.append(int(nxt))
                out_ = model(input_ids=nxt, past_key_values=past, use_cache=True,
                             position_ids=torch.tensor([[6 + step]]))
                past = out_.past_key_values
        gen = torch.cat([p, torch.tensor([toks])], 1)
        cases["greedy_prompt"] = p[0].tolist()
        cases["greedy_generated"] = gen[0, 6:].tolist()
        ref["greedy.full_logits"] = logits(model, gen)[0]
        # 4. A 300-token sequence: log-probs of every next token and three logit rows.
        long = torch.randint(0, V, (1, 300), generator=g)
        lg = logits(model, long)[0]
        lp = torch.log_softmax(lg, -1)
        cases["long"] = long[0].tolist()
        ref["long.next_logprobs"] = lp[:-1].gather(-1, long[0, 1:, None])[:, 0]
        ref["long.rows"] = lg[[0, 150, 299]]
        save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(out, "reference.safetensors"))
        with open(os.path.join(out, "cases.json"), "w") as f:
            json.dump(cases, f)
        print(f"{name}: {sum(p.numel() for p in model.parameters())} params, disk {disk_dtype}")


if __name__ == "__main__":
    main()
