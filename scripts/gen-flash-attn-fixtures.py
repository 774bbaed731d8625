#!/usr/bin/env python3
"""Reference forward and backward of causal attention from PyTorch eager ops, for the fused
attention op's test (`shared/tests/flash_attn.rs`, `matches_torch_eager_attention`).

Run:  PY=$(/work/shared/tools/hf-reference/setup.sh | tail -1); $PY scripts/gen-flash-attn-fixtures.py
(or scripts/setup-torch-ref.sh: the same environment; only torch and safetensors are used).
Writes tests/fixtures/flash_attn/{reference.safetensors,cases.json} (float32, < 200 KB).

Attention is written as transformers' eager attention computes it: k/v repeated per query
head group (`repeat_kv`: head h reads kv head h // (heads / kv_heads)), scores = q kᵀ / sqrt(d)
plus an additive mask, softmax in float32, probs @ v. The mask is causal within each segment
(block-diagonal causal for packed rows); a row outside every segment (padding) sees all keys
and its output is multiplied by 0, so it is zero with zero gradients, as the op defines it.
Gradients are torch autograd's for the loss sum(out * grad_out).
"""
import json
import os

import torch
from safetensors.torch import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "flash_attn")

CASES = {
    # One causal row over two tiles of the kernel (64 keys), GQA 4 query heads / 2 kv heads.
    "causal_gqa": dict(b=1, heads=4, kv_heads=2, t=70, d=8, segments=[[[0, 70]]]),
    # Row 0: two packed sequences and right padding; row 1: left padding.
    "packed_padded": dict(b=2, heads=4, kv_heads=2, t=40, d=8,
                          segments=[[[0, 13], [13, 31]], [[6, 40]]]),
}


def attention(q, k, v, segments):
    b, heads, t, d = q.shape
    rep = heads // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    allowed = torch.zeros(b, t, t, dtype=torch.bool)
    keep = torch.zeros(b, t)
    for r, segs in enumerate(segments):
        for s, e in segs:
            allowed[r, s:e, s:e] = torch.tril(torch.ones(e - s, e - s, dtype=torch.bool))
            keep[r, s:e] = 1.0
    allowed |= (keep == 0)[:, :, None]  # padding rows: unmasked, zeroed below
    mask = torch.zeros(b, 1, t, t).masked_fill(~allowed[:, None], torch.finfo(torch.float32).min)
    scores = q @ k.transpose(-1, -2) / d ** 0.5 + mask
    probs = torch.softmax(scores.float(), dim=-1)
    return (probs @ v) * keep[:, None, :, None]


def main():
    os.makedirs(ROOT, exist_ok=True)
    g = torch.Generator().manual_seed(2024)
    tensors, meta = {}, {}
    for name, c in CASES.items():
        b, h, kv, t, d = c["b"], c["heads"], c["kv_heads"], c["t"], c["d"]
        q = torch.randn(b, h, t, d, generator=g).requires_grad_()
        k = torch.randn(b, kv, t, d, generator=g).requires_grad_()
        v = torch.randn(b, kv, t, d, generator=g).requires_grad_()
        grad_out = torch.randn(b, h, t, d, generator=g)
        out = attention(q, k, v, c["segments"])
        (out * grad_out).sum().backward()
        for key, x in [("q", q), ("k", k), ("v", v), ("grad_out", grad_out), ("out", out),
                       ("dq", q.grad), ("dk", k.grad), ("dv", v.grad)]:
            tensors[f"{name}.{key}"] = x.detach().contiguous()
        meta[name] = {"t": t, "segments": c["segments"]}
    save_file(tensors, os.path.join(ROOT, "reference.safetensors"))
    with open(os.path.join(ROOT, "cases.json"), "w") as f:
        json.dump(meta, f, indent=1)
    size = os.path.getsize(os.path.join(ROOT, "reference.safetensors"))
    print(f"{len(meta)} cases, reference.safetensors {size} bytes, torch {torch.__version__}")


if __name__ == "__main__":
    main()
