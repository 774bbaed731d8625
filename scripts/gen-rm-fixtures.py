#!/usr/bin/env python3
"""Reference scores from Hugging Face transformers for the reward-model verifier test.

Run:  PY=$(scripts/setup-torch-ref.sh | tail -1); $PY scripts/gen-rm-fixtures.py
Writes tests/fixtures/rm/model/{config.json,model.safetensors,tokenizer.json,tokenizer_config.json}
and tests/fixtures/rm/cases.json; read by actor/tests/reward_model_hf.rs and tests/score_cli.rs.

The model is transformers' own `Qwen3ForSequenceClassification` with `num_labels = 1`: a Qwen3
backbone plus a linear `score` head without bias, applied to the final hidden state of the
last non-pad token, which is exactly what `RewardModel` computes. It is tiny and random
(weights drawn by torch with a fixed seed, at a larger scale than the default so that scores
differ between pairs), saved in float32 in the layout transformers writes: `model.*` and
`score.weight`, no `lm_head.weight`, and `tie_word_embeddings = false` (Qwen3Config's default).

The tokenizer is the repo's tiny byte-level tokenizer (tests/fixtures/chat/tiny-tokenizer/, with
its ChatML chat template). The conversation of a (prompt, response) pair is rendered by
transformers' `apply_chat_template` the way `RewardModel::encode_pair` does (mode rule of
shared/src/chat/template.rs: the user turn gets " /think", `enable_thinking=True`, no generation
prompt) and tokenized by transformers; the Rust test checks that our ids are the same.

Expected scores come from one right-padded batch (pad = `<|endoftext|>`, with the attention
mask) and are checked here against each pair scored alone.
"""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_shim  # noqa: F401,E402  (must precede transformers)

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForSequenceClassification  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
TINY_TOKENIZER = os.path.join(ROOT, "tests", "fixtures", "chat", "tiny-tokenizer")
OUT = os.path.join(ROOT, "tests", "fixtures", "rm")
MODEL = os.path.join(OUT, "model")

PAIRS = [
    ("hi", "hello"),
    ("What is 2 + 2?", "4"),
    ("Write one sentence about the sea.", "The sea is wide, grey and never quite still."),
    ("List three colours.", "Red, green and blue. Also, if you want more: yellow, purple and orange!"),
]


def main():
    torch.manual_seed(4242)
    os.makedirs(MODEL, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TINY_TOKENIZER, name), os.path.join(MODEL, name))
    tok = AutoTokenizer.from_pretrained(MODEL)
    pad_id = tok.convert_tokens_to_ids("<|endoftext|>")
    cfg = Qwen3Config(
        vocab_size=264, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
        num_labels=1, pad_token_id=pad_id, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        architectures=["Qwen3ForSequenceClassification"],
    )
    model = Qwen3ForSequenceClassification._from_config(
        cfg, attn_implementation="eager", torch_dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif pname == "score.weight":
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    assert "score.weight" in state and "lm_head.weight" not in state, sorted(state)
    assert tuple(state["score.weight"].shape) == (1, cfg.hidden_size)
    path = os.path.join(MODEL, "model.safetensors")
    save_file(state, path, metadata={"format": "pt"})
    model.load_state_dict(load_file(path), strict=True)
    cfg_dict = cfg.to_dict()
    cfg_dict["torch_dtype"] = "float32"
    with open(os.path.join(MODEL, "config.json"), "w") as f:
        json.dump(cfg_dict, f, indent=2, sort_keys=True)

    cases = []
    seqs = []
    for prompt, response in PAIRS:
        messages = [{"role": "user", "content": prompt + " /think"},
                    {"role": "assistant", "content": response}]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False,
                                       enable_thinking=True)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert pad_id not in ids
        seqs.append(ids)
        cases.append({"prompt": prompt, "response": response, "text": text, "ids": ids})
    width = max(len(s) for s in seqs)
    assert len({len(s) for s in seqs}) == len(seqs), "lengths should differ"
    ids = torch.tensor([s + [pad_id] * (width - len(s)) for s in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    with torch.no_grad():
        batched = model(input_ids=ids, attention_mask=mask).logits[:, 0]
        for case, s, b in zip(cases, seqs, batched.tolist()):
            alone = model(input_ids=torch.tensor([s])).logits[0, 0].item()
            assert abs(alone - b) < 1e-5, (alone, b)
            case["score"] = b
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        f.write('{"pad_token_id": %d, "cases": [\n' % pad_id)
        f.write(",\n".join(json.dumps(c) for c in cases))
        f.write("\n]}\n")
    for c in cases:
        print(f"{len(c['ids']):3d} tokens  score {c['score']:+.6f}  {c['prompt']!r}")
    total = sum(os.path.getsize(os.path.join(d, f)) for d in (OUT, MODEL)
                for f in os.listdir(d) if os.path.isfile(os.path.join(d, f)))
    print(f"{sum(p.numel() for p in model.parameters())} params; fixture {total} bytes")


if __name__ == "__main__":
    main()
