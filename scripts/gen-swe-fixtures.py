#!/usr/bin/env python3
"""Reference values for the SWE verifier's lexical similarity, from CPython's difflib.

Writes tests/fixtures/rewards/swe/ratio_pairs.jsonl (strings a, b, the matched character
count and difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()) and
tests/fixtures/rewards/swe/patch_pairs.jsonl (a predicted and a gold unified diff made with
difflib.unified_diff over random multi-file edits, and the SWE-RL similarity: per file the
ratio of the '+'/'-' lines (trailing whitespace stripped, joined by newlines), 0 when only one
side touches the file, averaged over all files). Deterministic (seeded); stdlib only.
"""
import difflib
import json
import pathlib
import random

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests/fixtures/rewards/swe"
rng = random.Random(20240611)


def ratio(a, b):
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def random_string(alphabet, n):
    return "".join(rng.choice(alphabet) for _ in range(n))


def edited(s, alphabet, edits):
    s = list(s)
    for _ in range(edits):
        op = rng.random()
        pos = rng.randrange(len(s) + 1)
        if op < 0.4 or not s:
            s.insert(pos, rng.choice(alphabet))
        elif op < 0.7:
            del s[min(pos, len(s) - 1)]
        else:
            s[min(pos, len(s) - 1)] = rng.choice(alphabet)
    return "".join(s)


ALPHABETS = ["ab", "abc ", "abcdefghij \n", "def return self.x = ( ) : \n+-", "αβγ→ab 😀\n"]


def ratio_pairs():
    rows = []
    for k in range(300):
        alphabet = ALPHABETS[k % len(ALPHABETS)]
        n = rng.choice([0, 1, 5, 20, 80, 250, 600])
        a = random_string(alphabet, n)
        if k % 3 == 0:
            b = random_string(alphabet, rng.choice([0, 3, 40, 300]))
        else:
            b = edited(a, alphabet, rng.randrange(1, 30))
        sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
        matches = sum(m.size for m in sm.get_matching_blocks())
        rows.append({"a": a, "b": b, "matches": matches, "ratio": sm.ratio()})
    return rows


WORDS = ["x", "y", "self", "return", "if", "None", "value", "items", "len", "+", "==", "(", ")", ":", "1", "0"]


def random_file(n_lines):
    return ["    " * rng.randrange(3) + " ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 8)))
            for _ in range(n_lines)]


def edit_file(lines):
    lines = list(lines)
    for _ in range(rng.randrange(1, 4)):
        pos = rng.randrange(len(lines))
        op = rng.random()
        if op < 0.5:
            lines[pos] = lines[pos] + " " + rng.choice(WORDS) + ("  " if rng.random() < 0.2 else "")
        elif op < 0.75:
            lines.insert(pos, " ".join(rng.choice(WORDS) for _ in range(4)))
        elif len(lines) > 1:
            del lines[pos]
    return lines


def unified(path, old, new):
    out = difflib.unified_diff(old, new, "a/" + path, "b/" + path, lineterm="")
    return "\n".join(out) + "\n"


def changes(files_old, edits):
    """path -> normalised change, computed from the edit itself (not by parsing the diff)."""
    result = {}
    for path, new in edits.items():
        old = files_old[path]
        lines = [l for l in difflib.unified_diff(old, new, lineterm="", n=3)]
        changed = [l.rstrip() for l in lines[2:] if l[:1] in "+-"]
        result[path] = "\n".join(changed)
    return result


def patch_pairs():
    rows = []
    for _ in range(60):
        paths = [f"pkg/mod{i}.py" for i in range(rng.randrange(1, 4))]
        files = {p: random_file(rng.randrange(3, 40)) for p in paths}
        gold_edit = {p: edit_file(files[p]) for p in paths if rng.random() < 0.8} or {paths[0]: edit_file(files[paths[0]])}
        roll = rng.random()
        if roll < 0.2:
            pred_edit = dict(gold_edit)
        else:
            pred_edit = {p: (edit_file(gold_edit[p]) if p in gold_edit and rng.random() < 0.6 else edit_file(files[p]))
                         for p in paths if rng.random() < 0.8} or {paths[-1]: edit_file(files[paths[-1]])}
        gold_edit = {p: e for p, e in gold_edit.items() if e != files[p]}
        pred_edit = {p: e for p, e in pred_edit.items() if e != files[p]}
        if not gold_edit or not pred_edit:
            continue
        gold = "".join(unified(p, files[p], e) for p, e in gold_edit.items())
        pred = "".join(unified(p, files[p], e) for p, e in pred_edit.items())
        gc, pc = changes(files, gold_edit), changes(files, pred_edit)
        all_paths = set(gc) | set(pc)
        sims = [ratio(pc[p], gc[p]) if gc.get(p) and pc.get(p) else 0.0 for p in sorted(all_paths)]
        rows.append({"predicted": pred, "gold": gold, "similarity": sum(sims) / len(sims)})
    return rows


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    for name, rows in [("ratio_pairs.jsonl", ratio_pairs()), ("patch_pairs.jsonl", patch_pairs())]:
        with open(OUT / name, "w") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        print(f"wrote {len(rows)} rows to {OUT / name}")


if __name__ == "__main__":
    main()
