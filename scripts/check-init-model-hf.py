#!/usr/bin/env python3
"""Checks that a `cascade init-model` checkpoint loads in Hugging Face transformers as is and
gives the log-probs `cascade inspect logprobs` prints.

Usage: PY=$(scripts/setup-torch-ref.sh | tail -1); $PY scripts/check-init-model-hf.py [CASCADE_BIN] [CONFIG]
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_shim  # noqa: F401,E402

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402

binary = sys.argv[1] if len(sys.argv) > 1 else "target/debug/cascade"
config = sys.argv[2] if len(sys.argv) > 2 else "configs/tiny-model.json"
with tempfile.TemporaryDirectory() as d:
    out = os.path.join(d, "m")
    subprocess.run([binary, "init-model", "--config", config, "--seed", "5", "--out", out], check=True)
    cfg = AutoConfig.from_pretrained(out)  # config.json as written by cascade
    tok = AutoTokenizer.from_pretrained(out)  # tokenizer.json + tokenizer_config.json
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", torch_dtype=torch.float32)
    missing, unexpected = model.load_state_dict(load_file(os.path.join(out, "model.safetensors")), strict=False)
    missing = [m for m in missing if not (cfg.tie_word_embeddings and m == "lm_head.weight")]
    assert not missing and not unexpected, (missing, unexpected)
    model.tie_weights()
    text = "<|im_start|>user\nWhat is 2 + 3? /think<|im_end|>\n<|im_start|>assistant\n<think>"
    ids = tok(text)["input_ids"]
    ours = json.loads(subprocess.run([binary, "inspect", "logprobs", "--model", out, "--text", text, "--json"],
                                     check=True, capture_output=True).stdout)
    assert ours["ids"] == ids, ("tokenization differs", ours["ids"], ids)
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].double(), -1)
    theirs = [lp[i - 1, ids[i]].item() for i in range(1, len(ids))]
    diff = max(abs(a - b) for a, b in zip(ours["logprobs"][1:], theirs))
    print(f"{cfg.model_type}: {len(ids)} tokens, max |Δlogprob| vs transformers = {diff:.2e}")
    assert diff < 1e-4
