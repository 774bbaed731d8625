#!/usr/bin/env python3
"""Generates the chat fixtures the Rust tests compare against (tests/fixtures/chat/).

References we did not write: Python jinja2 renders the chat templates the way Hugging Face
transformers does (`apply_chat_template`: ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, loopcontrols, its `tojson` and `raise_exception`), and Python `tokenizers`
encodes the text. Inputs:
  tests/fixtures/qwen3-tokenizer/   the real Qwen3 tokenizer.json + tokenizer_config.json
  tests/fixtures/chat/tiny-tokenizer/   the tiny tokenizer written by the Rust code
      (regenerate it with `CASCADE_BLESS=1 cargo test -p cascade-shared --test chat_tiny`)
Outputs: tests/fixtures/chat/qwen3_cases.json and tests/fixtures/chat/tiny_cases.json.

Mode rule (mirrors shared/src/chat/template.rs, documented there): the last user turn gets
" /think" or " /no_think" appended, and the template is rendered with
enable_thinking = (mode == "think").

Needs: pip install jinja2 tokenizers (scripts/setup-chat.sh).
"""
import json
import sys
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.sandbox
import tokenizers

ROOT = Path(__file__).resolve().parent.parent
QWEN_DIR = ROOT / "tests/fixtures/qwen3-tokenizer"
TINY_DIR = ROOT / "tests/fixtures/chat/tiny-tokenizer"
OUT_DIR = ROOT / "tests/fixtures/chat"


def compile_template(source):
    """transformers.utils.chat_template_utils._compile_jinja_template, without the
    {% generation %} extension (unused by these templates)."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)


def with_flag(messages, mode):
    flag = "/think" if mode == "think" else "/no_think"
    out = [dict(m) for m in messages]
    last_user = max(i for i, m in enumerate(out) if m["role"] == "user")
    if not out[last_user]["content"].rstrip().endswith(flag):
        out[last_user]["content"] += " " + flag
    return out


def render(template, config, messages, add_generation_prompt, enable_thinking):
    kwargs = {"bos_token": config.get("bos_token"), "eos_token": config.get("eos_token"),
              "pad_token": config.get("pad_token")}
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
    return template.render(messages=messages, tools=None, documents=None,
                           add_generation_prompt=add_generation_prompt, **kwargs)


def sft_mask(tok, text, messages, mode):
    """Independent of the Rust algorithm: the trained span is found in the text (after the
    last `<|im_start|>assistant\\n`, plus the empty think block in no-think mode, through the
    next `<|im_end|>`), then mapped to tokens with the tokenizer's character offsets."""
    enc = tok.encode(text, add_special_tokens=False)
    opener = "<|im_start|>assistant\n"
    start = text.rfind(opener) + len(opener)
    if mode == "no_think":
        empty = "<think>\n\n</think>\n\n"
        assert text[start:].startswith(empty)
        start += len(empty)
    end = text.index("<|im_end|>", start) + len("<|im_end|>")
    return [s >= start and e <= end for (s, e) in enc.offsets]


SYSTEM = "You are a helpful assistant."
REASONED = "<think>\nThe user asks for a sum. 2 + 2 = 4.\n</think>\n\n2 + 2 = **4**."

CASES = [
    # The two-turn conversation of issue 2, with a generation prompt, in both modes.
    {"name": "two_turn_think", "mode": "think", "add_generation_prompt": True,
     "messages": [{"role": "system", "content": SYSTEM},
                  {"role": "user", "content": "What is 2 + 2?"},
                  {"role": "assistant", "content": REASONED},
                  {"role": "user", "content": "And times 3?"}]},
    {"name": "two_turn_no_think", "mode": "no_think", "add_generation_prompt": True,
     "messages": [{"role": "system", "content": SYSTEM},
                  {"role": "user", "content": "What is 2 + 2?"},
                  {"role": "assistant", "content": "2 + 2 = **4**."},
                  {"role": "user", "content": "And times 3?"}]},
    # SFT samples: the assistant turn being trained on, in both modes.
    {"name": "sft_think", "mode": "think", "add_generation_prompt": False, "sft": True,
     "messages": [{"role": "user", "content": "What is 2 + 2?"},
                  {"role": "assistant", "content": REASONED}]},
    {"name": "sft_no_think", "mode": "no_think", "add_generation_prompt": False, "sft": True,
     "messages": [{"role": "system", "content": SYSTEM},
                  {"role": "user", "content": "Say hi."},
                  {"role": "assistant", "content": "Hi!"},
                  {"role": "user", "content": "Again, in French."},
                  {"role": "assistant", "content": "Salut !"}]},
    # Unicode, blank lines and a flag already present.
    {"name": "unicode_flag_present", "mode": "think", "add_generation_prompt": True,
     "messages": [{"role": "user",
                   "content": "Écris «bonjour» 👋 en 日本語.\n\n\tDeux paragraphes. /think"}]},
    # Multi-turn history with reasoning in an earlier turn (it is dropped by the template).
    {"name": "history_reasoning_dropped", "mode": "no_think", "add_generation_prompt": True,
     "messages": [{"role": "user", "content": "q1"},
                  {"role": "assistant", "content": "<think>\nr1\n</think>\n\na1"},
                  {"role": "user", "content": "q2"},
                  {"role": "assistant", "content": "a2"},
                  {"role": "user", "content": "q3"}]},
]

TINY_STRINGS = ["", "hello world", "Écris «bonjour» 👋 en 日本語\n\n\t",
                "<|im_start|>user\nhi<|im_end|>\n<think>\n\n</think>\n\n", "\x00\x7f\u00ad"]


def build(tok_dir, out_name, extra_raw):
    tok = tokenizers.Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    template = compile_template(config["chat_template"])
    cases = []
    for case in CASES:
        flagged = with_flag(case["messages"], case["mode"])
        text = render(template, config, flagged, case["add_generation_prompt"],
                      case["mode"] == "think")
        entry = dict(case, text=text,
                     ids=tok.encode(text, add_special_tokens=False).ids)
        if case.get("sft"):
            entry["assistant_mask"] = sft_mask(tok, text, case["messages"], case["mode"])
        cases.append(entry)
    raw = []
    for case in CASES[:2]:
        for enable_thinking in (None, True, False):
            raw.append({"name": case["name"], "messages": case["messages"],
                        "add_generation_prompt": True, "enable_thinking": enable_thinking,
                        "text": render(template, config, case["messages"], True,
                                       enable_thinking)})
    doc = {"generated_by": "scripts/gen-chat-fixtures.py",
           "jinja2": jinja2.__version__, "tokenizers": tokenizers.__version__,
           "cases": cases, "raw": raw}
    doc.update(extra_raw(tok))
    (OUT_DIR / out_name).write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT_DIR / out_name}: {len(cases)} cases")


def qwen_extra(tok):
    specials = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|endoftext|>"]
    return {"special_ids": {s: tok.token_to_id(s) for s in specials}}


def tiny_extra(tok):
    strings = []
    for s in TINY_STRINGS:
        ids = tok.encode(s, add_special_tokens=False).ids
        back = tok.decode(ids, skip_special_tokens=False)
        if back != s:
            sys.exit(f"tiny tokenizer does not round-trip {s!r} in Python: {back!r}")
        strings.append({"text": s, "ids": ids})
    if tok.get_vocab_size(with_added_tokens=True) > 512:
        sys.exit("tiny tokenizer vocabulary exceeds 512")
    return {"vocab_size": tok.get_vocab_size(with_added_tokens=True), "strings": strings}


def main():
    if not (TINY_DIR / "tokenizer.json").exists():
        sys.exit(f"{TINY_DIR}/tokenizer.json missing: run "
                 "CASCADE_BLESS=1 cargo test -p cascade-shared --test chat_tiny first")
    build(QWEN_DIR, "qwen3_cases.json", qwen_extra)
    build(TINY_DIR, "tiny_cases.json", tiny_extra)


if __name__ == "__main__":
    main()
