#!/usr/bin/env python3
"""Reference judge verdicts from Hugging Face transformers for the SWE judge scorer test.

Run:  PY=$(scripts/setup-torch-ref.sh | tail -1); $PY scripts/gen-judge-fixtures.py
Writes tests/fixtures/judge/model/{config.json,model.safetensors,tokenizer.json,tokenizer_config.json}
and tests/fixtures/judge/cases.json; read by actor/tests/judge_hf.rs and tests/score_cli.rs.

The judge is a tiny random `Qwen3ForCausalLM` built by transformers (tied embeddings, weights
drawn by torch with a fixed seed at a larger scale than the default so that the YES/NO
log-probabilities move with the prompt), with the repo's tiny byte-level tokenizer and its
ChatML template (tests/fixtures/chat/tiny-tokenizer/).

For each (issue, gold patch, candidate patch) case:
  - the user message is `judge_message` below, which must stay identical to
    `cascade_actor::judge::judge_message` (the Rust test compares the token ids);
  - the prompt is rendered by transformers' `apply_chat_template` in no-think mode the way
    our chat code does it (shared/src/chat/template.rs: " /no_think" appended to the user turn,
    `enable_thinking=False`, generation prompt added) and tokenized by transformers;
  - transformers' logits at the last position, log_softmax'ed, give log P(YES) and log P(NO)
    for the first token of "YES" and of "NO" as the tokenizer encodes them;
  - expected score = p_yes / (p_yes + p_no), in float64.
"""
import json
import math
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_shim  # noqa: F401,E402  (must precede transformers)

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
TINY_TOKENIZER = os.path.join(ROOT, "tests", "fixtures", "chat", "tiny-tokenizer")
OUT = os.path.join(ROOT, "tests", "fixtures", "judge")
MODEL = os.path.join(OUT, "model")


def judge_message(issue, gold, candidate):
    """Mirror of cascade_actor::judge::judge_message."""
    text = ("You are reviewing a candidate patch for a software issue. Decide whether the candidate "
            "patch fixes the same issue as the reference patch, in an equivalent way.\n\n")
    if issue is not None:
        text += "Issue:\n" + issue.rstrip("\n") + "\n\n"
    text += "Reference patch:\n```diff\n" + gold.rstrip("\n")
    text += "\n```\n\nCandidate patch:\n```diff\n" + candidate.rstrip("\n")
    text += "\n```\n\nDo the two patches fix the same issue? Answer YES or NO."
    return text


def patch(file, bug, fix):
    return f"--- a/{file}\n+++ b/{file}\n@@ -2 +2 @@\n-    return {bug}\n+    return {fix}\n"


CASES = [
    # Same fix, written differently (the datagen SWE task shape).
    ("Fix m.py to return a + b:\ndef f(a, b):\n    return a - b",
     patch("m.py", "a - b", "a + b"), patch("m.py", "a - b", "b + a")),
    # A different fix, no issue text.
    (None, patch("ops.py", "x * 2", "x * 3"), patch("ops.py", "x * 2", "x + x")),
    # Another file entirely.
    ("Bug in calc.py: must return n - 1.",
     patch("calc.py", "n + 1", "n - 1"), patch("app.py", "n + 1", "n - 1")),
    # Two hunks against one.
    ("lib.py should return abs(v). Fix it:\ndef g(v):\n    return v",
     patch("lib.py", "v", "abs(v)"),
     "--- a/lib.py\n+++ b/lib.py\n@@ -1,2 +1,2 @@\n-def g(v):\n+def g(v: int):\n"
     "     return v\n@@ -2 +2 @@\n-    return v\n+    return v if v > 0 else -v\n"),
]


def main():
    torch.manual_seed(777)
    os.makedirs(MODEL, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TINY_TOKENIZER, name), os.path.join(MODEL, name))
    tok = AutoTokenizer.from_pretrained(MODEL)
    cfg = Qwen3Config(
        vocab_size=264, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=1024,
        rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        architectures=["Qwen3ForCausalLM"],
    )
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", torch_dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.25 * torch.randn_like(p))
    model.tie_weights()
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    path = os.path.join(MODEL, "model.safetensors")
    save_file(state, path, metadata={"format": "pt"})
    model.load_state_dict(load_file(path), strict=False)
    model.tie_weights()
    cfg_dict = cfg.to_dict()
    cfg_dict["torch_dtype"] = "float32"
    with open(os.path.join(MODEL, "config.json"), "w") as f:
        json.dump(cfg_dict, f, indent=2, sort_keys=True)

    yes_id = tok("YES", add_special_tokens=False)["input_ids"][0]
    no_id = tok("NO", add_special_tokens=False)["input_ids"][0]
    assert yes_id != no_id
    cases = []
    for issue, gold, candidate in CASES:
        content = judge_message(issue, gold, candidate) + " /no_think"
        text = tok.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                       add_generation_prompt=True, enable_thinking=False)
        assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"), text[-60:]
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert len(ids) <= cfg.max_position_embeddings
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].double()
        logp = torch.log_softmax(logits, -1)
        lp_yes, lp_no = logp[yes_id].item(), logp[no_id].item()
        p_yes, p_no = math.exp(lp_yes), math.exp(lp_no)
        cases.append({"issue": issue, "gold": gold, "candidate": candidate, "ids": ids,
                      "logp_yes": lp_yes, "logp_no": lp_no, "p_yes": p_yes, "p_no": p_no,
                      "score": p_yes / (p_yes + p_no)})
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        f.write('{"yes_id": %d, "no_id": %d, "cases": [\n' % (yes_id, no_id))
        f.write(",\n".join(json.dumps(c) for c in cases))
        f.write("\n]}\n")
    for c in cases:
        print(f"{len(c['ids']):4d} tokens  p_yes {c['p_yes']:.5f}  p_no {c['p_no']:.5f}  score {c['score']:.5f}")
    total = sum(os.path.getsize(os.path.join(d, f)) for d in (OUT, MODEL)
                for f in os.listdir(d) if os.path.isfile(os.path.join(d, f)))
    print(f"yes_id {yes_id}, no_id {no_id}; {sum(p.numel() for p in model.parameters())} params; "
          f"fixture {total} bytes")


if __name__ == "__main__":
    main()
