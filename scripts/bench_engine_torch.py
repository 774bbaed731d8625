#!/usr/bin/env python3
"""PyTorch side of scripts/bench-engine.sh: KV-cached decode with multinomial sampling at T=1
(transformers, eager, f32) at batch 1/8/64 on the same checkpoint, as JSON lines.
Usage: bench_engine_torch.py MODEL_DIR [steps]."""
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
    d = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", os.cpu_count())))
    cfg = AutoConfig.from_pretrained(d)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", torch_dtype=torch.float32)
    model.load_state_dict(load_file(os.path.join(d, "model.safetensors")), strict=False)
    model.tie_weights()
    model.eval()
    V, plen = cfg.vocab_size, 16
    g = torch.Generator().manual_seed(0)
    for b in [1, 8, 64]:
        best = 1e9
        for _ in range(2):
            prompts = torch.tensor([[(r * 31 + i * 17) % V for i in range(plen)] for r in range(b)])
            with torch.no_grad():
                out = model(input_ids=prompts, use_cache=True)
                past = out.past_key_values
                nxt = torch.multinomial(torch.softmax(out.logits[:, -1].float(), -1), 1, generator=g)
                t = time.perf_counter()
                for s in range(steps - 1):
                    out = model(input_ids=nxt, past_key_values=past, use_cache=True,
                                position_ids=torch.full((b, 1), plen + s))
                    past = out.past_key_values
                    probs = torch.softmax(out.logits[:, -1].float(), -1)
                    lp = torch.log(probs)  # behaviour log-prob, as the engine computes it
                    nxt = torch.multinomial(probs, 1, generator=g)
                    lp.gather(-1, nxt)
                best = min(best, time.perf_counter() - t)
        print(json.dumps({"bench": "engine_decode", "batch": b, "steps": steps - 1,
                          "tokens_per_s": b * (steps - 1) / best}))


if __name__ == "__main__":
    main()
