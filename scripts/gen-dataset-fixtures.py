#!/usr/bin/env python3
"""Writes tests/fixtures/datasets/: sample rows in each public dataset layout that cascade's
dataset readers take (shared/src/data/presets), as JSONL or Parquet the way each dataset is
published. The rows are written by hand from the public dataset cards (no download); a few are
deliberately bad, to check that they are rejected with a reason. Parquet needs pyarrow: when it
is missing, a venv with it is created at ${CASCADE_DATASETS_VENV:-/tmp/cascade-datasets-venv}
and the script re-runs itself there. Deterministic; `cargo test` reads only the committed output.

    python3 scripts/gen-dataset-fixtures.py
"""
import base64
import json
import os
import pickle
import subprocess
import sys
import zlib

PYARROW = "pyarrow==21.0.0"


def ensure_pyarrow():
    try:
        import pyarrow  # noqa: F401
        return
    except ImportError:
        pass
    venv = os.environ.get("CASCADE_DATASETS_VENV", "/tmp/cascade-datasets-venv")
    py = os.path.join(venv, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(venv):
        sys.exit(f"gen-dataset-fixtures: pyarrow is not importable in {py}")
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", PYARROW], check=True)
    os.execv(py, [py] + sys.argv)


ensure_pyarrow()
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "datasets")
os.makedirs(OUT, exist_ok=True)


def msg(role, content):
    return {"role": role, "content": content}


def write_jsonl(name, rows):
    with open(os.path.join(OUT, name), "w") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def write_parquet(name, rows, schema, row_group_size=None):
    table = pa.Table.from_pylist(rows, schema=schema)
    pq.write_table(table, os.path.join(OUT, name), row_group_size=row_group_size,
                   compression="snappy")


MESSAGES = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))

# ---- our own layouts ----
write_jsonl("cascade_sft.jsonl", [
    {"id": 0, "messages": [msg("user", "What is 2+2?"), msg("assistant", "<think>\n2+2=4\n</think>\n\n4")], "mode": "think"},
    {"id": 1, "messages": [msg("user", "Capital of France?"), msg("assistant", "Paris.")], "mode": "no_think"},
    {"id": 2, "messages": [msg("user", "Only a question, no answer")], "mode": "think"},  # rejected
])

# ---- Nemotron-Cascade (the paper's data) ----
nemotron_sft = [
    {"messages": [msg("user", "Sum of 1..10?"), msg("assistant", "<think>\nn(n+1)/2 = 55\n</think>\n\nThe sum is 55.")]},
    {"messages": [msg("user", "Say hi."), msg("assistant", "<think>\n\n</think>\n\nHi!")]},
    {"messages": [msg("system", "detailed thinking off"), msg("user", "Name a colour."), msg("assistant", "Blue.")]},
    {"messages": [msg("user", "Is 7 prime?"), msg("assistant", "Yes, 7 is prime.")], "reasoning": "7 has no divisor between 2 and 6."},
    {"messages": [msg("system", "/no_think"), msg("user", "2*3?"), msg("assistant", "<think>\n2*3 is 6\n</think>\n\n6")]},  # rejected: thinks in no_think
]
write_jsonl("nemotron_sft.jsonl", nemotron_sft)
write_parquet("nemotron_sft.parquet", [r for r in nemotron_sft if "reasoning" not in r],
              pa.schema([("messages", MESSAGES)]))

write_parquet("nemotron_rlhf.parquet", [
    {"prompt": [msg("user", "Write a haiku about autumn.")]},
    {"prompt": [msg("system", "You are concise."), msg("user", "Explain TCP in one sentence.")]},
    {"prompt": [msg("user", "Hi"), msg("assistant", "Hello!")]},  # rejected: ends with assistant
], pa.schema([("prompt", MESSAGES)]))

IF_KWARGS = pa.struct([("num_words", pa.int64()), ("relation", pa.string()),
                       ("keywords", pa.list_(pa.string())), ("end_phrase", pa.string()),
                       ("num_highlights", pa.int64())])
nemotron_if = [
    {"prompt": "Describe a cat in under 50 words.", "instruction_id_list": ["length_constraints:number_words"],
     "kwargs": [{"num_words": 50, "relation": "less than", "keywords": None, "end_phrase": None, "num_highlights": None}]},
    {"prompt": [msg("user", "Write about rain. Use the word umbrella and end with 'Stay dry.'")],
     "instruction_id_list": ["keywords:existence", "startend:end_checker"],
     "kwargs": [{"num_words": None, "relation": None, "keywords": ["umbrella"], "end_phrase": None, "num_highlights": None},
                {"num_words": None, "relation": None, "keywords": None, "end_phrase": "Stay dry.", "num_highlights": None}]},
    {"prompt": "Highlight two sections.", "instruction_id_list": ["detectable_format:number_highlighted_sections", "change_case:english_lowercase"],
     "kwargs": [{"num_words": None, "relation": None, "keywords": None, "end_phrase": None, "num_highlights": 2}]},  # rejected: 1 kwargs for 2 ids
]
write_jsonl("nemotron_if.jsonl", nemotron_if)
write_parquet("nemotron_if.parquet", [dict(r, prompt=r["prompt"] if isinstance(r["prompt"], str) else r["prompt"][0]["content"]) for r in nemotron_if],
              pa.schema([("prompt", pa.string()), ("instruction_id_list", pa.list_(pa.string())), ("kwargs", pa.list_(IF_KWARGS))]))

write_jsonl("nemotron_math.jsonl", [
    {"problem": "Compute $\\frac{1}{2}+\\frac{1}{3}$.", "answer": "\\frac{5}{6}"},
    {"problem": "How many primes are below 20?", "answer": "8"},
    {"problem": "Find x if 2x=10.", "answer": None},  # rejected: no answer
])

write_jsonl("nemotron_swe.jsonl", [
    {"prompt": "Fix the off-by-one in utils.last():\n\n```python\ndef last(xs):\n    return xs[len(xs)]\n```",
     "golden_patch": "--- a/utils.py\n+++ b/utils.py\n@@ -1,2 +1,2 @@\n def last(xs):\n-    return xs[len(xs)]\n+    return xs[len(xs) - 1]\n"},
    {"prompt": [msg("user", "Make greet() use an f-string.")],
     "golden_patch": "--- a/g.py\n+++ b/g.py\n@@ -1,2 +1,2 @@\n def greet(n):\n-    return 'hi ' + n\n+    return f'hi {n}'\n"},
    {"prompt": "No patch for this one.", "golden_patch": ""},  # rejected: empty gold patch
])

# ---- peers' conventions ----
VERL = pa.schema([("data_source", pa.string()), ("prompt", MESSAGES), ("ability", pa.string()),
                  ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
                  ("extra_info", pa.struct([("split", pa.string()), ("index", pa.int64())]))])
write_parquet("verl_gsm8k.parquet", [
    {"data_source": "openai/gsm8k", "prompt": [msg("user", "Natalia sold clips to 48 friends in April, and half as many in May. How many in total? Let's think step by step and output the final answer after \"####\".")],
     "ability": "math", "reward_model": {"style": "rule", "ground_truth": "72"}, "extra_info": {"split": "train", "index": 0}},
    {"data_source": "openai/gsm8k", "prompt": [msg("user", "Weng earns $12 an hour. She did 50 minutes of babysitting. How much did she earn?")],
     "ability": "math", "reward_model": {"style": "rule", "ground_truth": "10"}, "extra_info": {"split": "train", "index": 1}},
    {"data_source": "openai/gsm8k", "prompt": [msg("user", "A row with no ground truth.")],
     "ability": "math", "reward_model": {"style": "rule", "ground_truth": None}, "extra_info": {"split": "train", "index": 2}},  # rejected
], VERL)
write_jsonl("verl_mixed.jsonl", [
    {"data_source": "codegen/primeintellect", "prompt": [msg("user", "Read n and print n squared.")], "ability": "code",
     "reward_model": {"style": "rule", "ground_truth": json.dumps({"inputs": ["3\n", "5\n"], "outputs": ["9\n", "25\n"]})},
     "extra_info": {"split": "train", "index": 0}},
    {"data_source": "lighteval/MATH", "prompt": [msg("user", "What is $\\sqrt{16}$?")], "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "4"}, "extra_info": {"split": "train", "index": 1}},
    {"data_source": "my_custom_set", "prompt": [msg("user", "Unknown domain.")], "ability": "other",
     "reward_model": {"style": "rule", "ground_truth": "x"}, "extra_info": {"split": "train", "index": 2}},  # rejected: which domain?
])
write_parquet("dapo_math.parquet", [
    {"data_source": "math_dapo", "prompt": [msg("user", "Solve the following math problem step by step. The last line of your response should be of the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\nIn triangle $ABC$, $AB=3$, $BC=4$ and $\\angle B=90^\\circ$. Find $AC$.\n\nRemember to put your answer on its own line after \"Answer:\".")],
     "ability": "MATH", "reward_model": {"style": "rule-lighteval/MATH_v2", "ground_truth": "5"}, "extra_info": {"split": None, "index": 0}},
    {"data_source": "math_dapo", "prompt": [msg("user", "Solve the following math problem step by step. Find the number of positive divisors of 36.\n\nRemember to put your answer on its own line after \"Answer:\".")],
     "ability": "MATH", "reward_model": {"style": "rule-lighteval/MATH_v2", "ground_truth": "9"}, "extra_info": {"split": None, "index": 1}},
], VERL)

write_jsonl("trl_sft.jsonl", [
    {"prompt": "The sky is", "completion": " blue."},
    {"prompt": [msg("user", "What color is the sky?")], "completion": [msg("assistant", "<think>\nRayleigh scattering.\n</think>\n\nIt is blue.")]},
    {"prompt": "No completion here", "completion": None},  # rejected
])
write_jsonl("trl_pairs_conversational.jsonl", [
    {"prompt": [msg("user", "What color is the sky?")], "chosen": [msg("assistant", "It is blue.")], "rejected": [msg("assistant", "It is green.")]},
    {"prompt": [msg("user", "2+2?")], "chosen": [msg("assistant", "4")], "rejected": [msg("assistant", "5")]},
    {"prompt": [msg("user", "Hi"), msg("assistant", "Hello"), msg("user", "Bye")], "chosen": [msg("assistant", "Bye!")], "rejected": [msg("assistant", "...")]},  # rejected: multi-turn
])
write_jsonl("trl_pairs_implicit.jsonl", [
    {"chosen": [msg("user", "What color is the sky?"), msg("assistant", "It is blue.")],
     "rejected": [msg("user", "What color is the sky?"), msg("assistant", "It is green.")]},
    {"chosen": [msg("user", "Capital of Italy?"), msg("assistant", "Rome.")],
     "rejected": [msg("user", "Capital of Spain?"), msg("assistant", "Rome.")]},  # rejected: prompts differ
])
write_jsonl("openrlhf.jsonl", [
    {"input": "What is 3*7?", "label": "21"},
    {"input": [msg("user", "What is 10/4?")], "label": "2.5"},
    {"input": "", "label": "0"},  # rejected: empty prompt
])

# ---- math benchmarks ----
write_jsonl("aime_2024.jsonl", [
    {"id": 60, "problem": "Every morning Aya goes for a $9$-kilometer-long walk ... Find the number of minutes the walk takes her, including the $t$ minutes spent in the coffee shop.",
     "solution": "$s=3$ ... so the answer is $\\boxed{204}$.", "answer": "204", "url": "https://artofproblemsolving.com/wiki/index.php/2024_AIME_I_Problems/Problem_1", "year": "2024"},
    {"id": 61, "problem": "There exist real numbers $x$ and $y$, both greater than 1, such that $\\log_x(y^x)=\\log_y(x^{4y})=10$. Find $xy$.",
     "solution": "... $xy=25$.", "answer": "025", "url": "https://artofproblemsolving.com/wiki/index.php/2024_AIME_I_Problems/Problem_2", "year": "2024"},
])
write_jsonl("aime_2025.jsonl", [
    {"question": "Find the sum of all integer bases $b>9$ for which $17_b$ is a divisor of $97_b$.", "answer": "70"},
    {"question": "On $\\triangle ABC$ points $A,D,E$, and $B$ lie in that order on side $\\overline{AB}$ ... Find the area of heptagon $AFNBCEM$.", "answer": 588},
])
write_jsonl("math500.jsonl", [
    {"problem": "Convert the point $(0,3)$ in rectangular coordinates to polar coordinates.", "solution": "... $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$",
     "answer": "\\left( 3, \\frac{\\pi}{2} \\right)", "subject": "Precalculus", "level": 2, "unique_id": "test/precalculus/807.json"},
    {"problem": "If $f(x) = \\frac{3x-2}{x-2}$, what is the value of $f(-2) +f(-1)+f(0)$?", "solution": "... $\\boxed{\\frac{14}{3}}$",
     "answer": "\\frac{14}{3}", "subject": "Algebra", "level": 3, "unique_id": "test/algebra/2584.json"},
])
write_jsonl("deepscaler.jsonl", [
    {"problem": "The operation $\\otimes$ is defined for all nonzero numbers by $a \\otimes b = \\frac{a^{2}}{b}$. Determine $[(1 \\otimes 2) \\otimes 3] - [1 \\otimes (2 \\otimes 3)]$.", "answer": "-\\frac{2}{3}", "solution": "..."},
    {"problem": "Doug constructs a square window using 8 equal-size panes of glass ... What is the side length of the square window?", "answer": "26", "solution": "..."},
])

# ---- instruction following ----
write_jsonl("ifeval_input_data.jsonl", [
    {"key": 1000, "prompt": "Write a 300+ word summary of the wikipedia page ... Do not use any commas and highlight at least 3 sections that has titles in markdown format.",
     "instruction_id_list": ["punctuation:no_comma", "detectable_format:number_highlighted_sections", "length_constraints:number_words"],
     "kwargs": [{}, {"num_highlights": 3}, {"relation": "at least", "num_words": 300}]},
    {"key": 1001, "prompt": "I am planning a trip to Japan ... Your entire response should be in lowercase letters.",
     "instruction_id_list": ["change_case:english_lowercase"], "kwargs": [{}]},
    {"key": 1005, "prompt": "Write a resume.", "instruction_id_list": "not a list", "kwargs": [{}]},  # rejected
])

# ---- code ----
def lcb_blob(cases):
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


write_jsonl("livecodebench.jsonl", [
    {"question_title": "Sum of Three", "question_content": "You are given N integers. Print their sum.\n\nInput\n\nN\nA_1 ... A_N",
     "platform": "atcoder", "question_id": "abc300_a", "contest_id": "abc300", "contest_date": "2023-04-29T00:00:00",
     "starter_code": "", "difficulty": "easy",
     "public_test_cases": json.dumps([{"input": "2\n1 2\n", "output": "3\n", "testtype": "stdin"}]),
     "private_test_cases": lcb_blob([{"input": "3\n1 2 3\n", "output": "6\n", "testtype": "stdin"}, {"input": "1\n5\n", "output": "5\n", "testtype": "stdin"}]),
     "metadata": "{}"},
    {"question_title": "Two Sum", "question_content": "Given nums and target, return indices of the two numbers that add up to target.",
     "platform": "leetcode", "question_id": "1", "contest_id": "weekly-contest-1", "contest_date": "2023-09-02T00:00:00",
     "starter_code": "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n        ",
     "difficulty": "easy",
     "public_test_cases": json.dumps([{"input": "[2,7,11,15]\n9", "output": "[0, 1]", "testtype": "functional"}]),
     "private_test_cases": json.dumps([]), "metadata": json.dumps({"func_name": "twoSum"})},  # rejected: call-based only
    {"question_title": "Broken", "question_content": "A problem whose private tests do not decode.", "platform": "codeforces",
     "question_id": "1900A", "contest_id": "1900", "contest_date": "2023-11-24T00:00:00", "starter_code": "", "difficulty": "medium",
     "public_test_cases": json.dumps([{"input": "1\n", "output": "1\n", "testtype": "stdin"}]),
     "private_test_cases": base64.b64encode(zlib.compress(pickle.dumps([1, 2]))).decode(), "metadata": "{}"},  # rejected: pickle is not a string
    {"question_title": "Late", "question_content": "Print 42.", "platform": "atcoder", "question_id": "abc400_a", "contest_id": "abc400",
     "contest_date": "2025-04-05T00:00:00", "starter_code": "", "difficulty": "easy",
     "public_test_cases": json.dumps([{"input": "", "output": "42\n", "testtype": "stdin"}]), "private_test_cases": "", "metadata": "{}"},
])
write_jsonl("apps.jsonl", [
    {"problem_id": 0, "question": "Read two integers and print their sum.", "solutions": json.dumps(["a,b=map(int,input().split());print(a+b)"]),
     "input_output": json.dumps({"inputs": ["1 2\n", "10 20\n"], "outputs": ["3\n", "30\n"]}), "difficulty": "introductory", "url": "https://codeforces.com/problemset/problem/1/A", "starter_code": ""},
    {"problem_id": 1, "question": "Return the square of x.", "solutions": json.dumps(["def square(x):\n    return x*x"]),
     "input_output": json.dumps({"fn_name": "square", "inputs": [[2], [3]], "outputs": [[4], [9]]}), "difficulty": "introductory", "url": "https://www.codewars.com/kata/x", "starter_code": "def square(x):\n\t"},  # rejected: call-based
    {"problem_id": 2, "question": "A problem without tests.", "solutions": "[]", "input_output": "", "difficulty": "interview", "url": "", "starter_code": ""},  # rejected
])
TESTS = pa.struct([("input", pa.list_(pa.string())), ("output", pa.list_(pa.string()))])
write_parquet("code_contests.parquet", [
    {"name": "1548_A. Web of Lies", "description": "Print the number of nobles that survive.",
     "public_tests": {"input": ["4 3\n2 1\n1 3\n3 4\n"], "output": ["2\n"]},
     "private_tests": {"input": ["1 0\n"], "output": ["1\n"]},
     "generated_tests": {"input": ["2 0\n"], "output": ["2\n"]}, "source": 2, "difficulty": 7},
    {"name": "no_tests", "description": "A problem with no tests at all.",
     "public_tests": {"input": [], "output": []}, "private_tests": {"input": [], "output": []},
     "generated_tests": {"input": [], "output": []}, "source": 2, "difficulty": 7},  # rejected
], pa.schema([("name", pa.string()), ("description", pa.string()), ("public_tests", TESTS),
              ("private_tests", TESTS), ("generated_tests", TESTS), ("source", pa.int64()), ("difficulty", pa.int64())]))

# ---- SWE ----
SWE_PATCH = "diff --git a/src/calc.py b/src/calc.py\n--- a/src/calc.py\n+++ b/src/calc.py\n@@ -1,2 +1,2 @@\n def mean(xs):\n-    return sum(xs) / len(xs) + 1\n+    return sum(xs) / len(xs)\n"
write_parquet("swe_bench.parquet", [
    {"repo": "acme/calc", "instance_id": "acme__calc-1", "base_commit": "0123abc", "patch": SWE_PATCH,
     "test_patch": "diff --git a/tests/test_calc.py b/tests/test_calc.py\n", "problem_statement": "mean() is off by one.",
     "hints_text": "", "created_at": "2023-01-01T00:00:00Z", "version": "1.0",
     "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_mean"]), "PASS_TO_PASS": json.dumps([]), "environment_setup_commit": "0123abc"},
    {"repo": "acme/calc", "instance_id": "acme__calc-2", "base_commit": "0123abd", "patch": "",
     "test_patch": "", "problem_statement": "A row without a gold patch.", "hints_text": "", "created_at": "2023-01-02T00:00:00Z",
     "version": "1.0", "FAIL_TO_PASS": "[]", "PASS_TO_PASS": "[]", "environment_setup_commit": "0123abd"},  # rejected
], pa.schema([(k, pa.string()) for k in ["repo", "instance_id", "base_commit", "patch", "test_patch", "problem_statement",
                                          "hints_text", "created_at", "version", "FAIL_TO_PASS", "PASS_TO_PASS", "environment_setup_commit"]]))
BUG = "diff --git a/src/calc.py b/src/calc.py\n--- a/src/calc.py\n+++ b/src/calc.py\n@@ -1,2 +1,2 @@\n def mean(xs):\n-    return sum(xs) / len(xs)\n+    return sum(xs) / len(xs) + 1\n"
write_jsonl("swe_smith.jsonl", [
    {"instance_id": "acme__calc.0123abc.func_pm_op_change__1", "repo": "swesmith/acme__calc.0123abc", "patch": BUG,
     "FAIL_TO_PASS": ["tests/test_calc.py::test_mean"], "PASS_TO_PASS": [], "created_at": "2025-04-01",
     "image_name": "swesmith.x86_64.acme__calc.0123abc", "base_commit": "0123abc", "problem_statement": "mean() returns one too many."},
    {"instance_id": "acme__calc.0123abc.func_pm_op_change__2", "repo": "swesmith/acme__calc.0123abc", "patch": "not a diff",
     "FAIL_TO_PASS": [], "PASS_TO_PASS": [], "created_at": "2025-04-01", "image_name": "swesmith.x86_64.acme__calc.0123abc",
     "base_commit": "0123abc", "problem_statement": "Broken patch."},  # rejected
    {"instance_id": "acme__calc.0123abc.func_pm_op_change__3", "repo": "swesmith/acme__calc.0123abc", "patch": BUG,
     "FAIL_TO_PASS": [], "PASS_TO_PASS": [], "created_at": "2025-04-01", "image_name": "swesmith.x86_64.acme__calc.0123abc",
     "base_commit": "0123abc", "problem_statement": ""},  # rejected: no issue text
])

# ---- preference pairs ----
write_jsonl("helpsteer3.jsonl", [
    {"domain": "general", "language": "english", "context": [msg("user", "Give me a tagline for a bakery.")],
     "response1": "Fresh from our oven to your table.", "response2": "We sell bread.", "overall_preference": -2,
     "individual_preference": [{"score": -2, "reasoning": "Response 1 is catchier."}]},
    {"domain": "code", "language": "python", "context": [msg("user", "Reverse a list in Python.")],
     "response1": "Use a loop.", "response2": "Use `xs[::-1]` or `xs.reverse()`.", "overall_preference": 2,
     "individual_preference": [{"score": 2, "reasoning": "Response 2 is concrete."}]},
    {"domain": "general", "language": "english", "context": [msg("user", "Say hello.")],
     "response1": "Hello!", "response2": "Hi!", "overall_preference": 0, "individual_preference": []},  # skipped: tie
    {"domain": "general", "language": "english", "context": [msg("user", "Hi"), msg("assistant", "Hello"), msg("user", "How are you?")],
     "response1": "Fine.", "response2": "Good, thanks!", "overall_preference": 1, "individual_preference": []},  # rejected: multi-turn
])
write_parquet("skywork_preference.parquet", [
    {"chosen": [msg("user", "What is the boiling point of water?"), msg("assistant", "100 °C at sea level.")],
     "rejected": [msg("user", "What is the boiling point of water?"), msg("assistant", "50 °C.")], "source": "helpsteer2"},
    {"chosen": [msg("user", "Translate 'cat' to French."), msg("assistant", "chat")],
     "rejected": [msg("user", "Translate 'cat' to French."), msg("assistant", "chien")], "source": "offsetbias"},
], pa.schema([("chosen", MESSAGES), ("rejected", MESSAGES), ("source", pa.string())]))

# ---- bad files and the index ----
write_jsonl("ambiguous_swe.jsonl", [
    {"instance_id": "x__y-1", "problem_statement": "p", "patch": SWE_PATCH, "test_patch": "", "image_name": "img"},
])
good = open(os.path.join(OUT, "nemotron_if.parquet"), "rb").read()
with open(os.path.join(OUT, "truncated.parquet"), "wb") as f:
    f.write(good[: len(good) // 2])
write_parquet("row_groups.parquet",
              [{"problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(1000)],
              pa.schema([("problem", pa.string()), ("answer", pa.string())]), row_group_size=64)
print(f"wrote {len(os.listdir(OUT))} files to {os.path.normpath(OUT)}")
