#!/usr/bin/env python3
"""PyTorch side of scripts/bench-model.sh: the same measurements as shared/benches/model.rs on
the same checkpoint, printed as JSON lines.
Usage: bench_model_torch.py MODEL_DIR [batch len] [--attn=eager|sdpa] [--checkpoint] [--train-only]
  --attn: transformers' attention implementation (sdpa: torch's fused attention, its best on CPU)
  --checkpoint: torch.utils.checkpoint around every decoder layer (gradient_checkpointing_enable)"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_shim  # noqa: F401,E402

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402


def main():
    flags = [a for a in sys.argv[1:] if a.startswith("--")]
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    d = args[0]
    batch = int(args[1]) if len(args) > 1 else 4
    length = int(args[2]) if len(args) > 2 else 128
    attn = next((f.split("=", 1)[1] for f in flags if f.startswith("--attn=")), "eager")
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", os.cpu_count())))
    cfg = AutoConfig.from_pretrained(d)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, torch_dtype=torch.float32)
    model.load_state_dict(load_file(os.path.join(d, "model.safetensors")), strict=False)
    model.tie_weights()
    if "--checkpoint" in flags:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()  # transformers checkpoints only in training mode; the model has no dropout
    V = cfg.vocab_size
    ids = torch.tensor([(i * 7919 + 13) % V for i in range(batch * length)]).view(batch, length)
    best = 1e9
    for i in range(3 if batch * length > 2048 else 11):  # as shared/benches/model.rs
        t = time.perf_counter()
        logits = model(input_ids=ids, use_cache=False).logits
        lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).sum()
        model.zero_grad(set_to_none=True)
        lp.backward()
        if i > 0:
            best = min(best, time.perf_counter() - t)
    print(json.dumps({"bench": "train", "batch": batch, "len": length, "tokens_per_s": batch * length / best,
                      "torch": torch.__version__, "attn": attn}))
    if "--train-only" in flags:
        return
    model.eval()
    steps, plen = 64, 16
    for b in [1, 8]:
        best = 1e9
        for _ in range(2):
            prompts = torch.tensor([[(r * 31 + i * 17) % V for i in range(plen)] for r in range(b)])
            with torch.no_grad():
                out = model(input_ids=prompts, use_cache=True)
                past = out.past_key_values
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                t = time.perf_counter()
                for s in range(steps):
                    out = model(input_ids=nxt, past_key_values=past, use_cache=True,
                                position_ids=torch.full((b, 1), plen + s))
                    past = out.past_key_values
                    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                best = min(best, time.perf_counter() - t)
        print(json.dumps({"bench": "decode", "batch": b, "steps": steps, "tokens_per_s": b * steps / best}))


if __name__ == "__main__":
    main()
