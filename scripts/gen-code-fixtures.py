#!/usr/bin/env python3
"""Builds tests/fixtures/rewards/code/{livecodebench,apps}_real.jsonl: real public problems in the
exact row layouts of LiveCodeBench code generation and APPS/TACO, for the code verifier's
call-based and stdin/stdout tests (rewards/tests/code_real.rs, which holds the correct, wrong and
hostile solutions).

LiveCodeBench rows: `question_content`, `starter_code`, `public_test_cases` (JSON text),
`private_test_cases` (base64 of zlib of a pickled JSON string, as the released dataset stores
them), `metadata` (JSON text with `func_name` for LeetCode problems), `platform`, `question_id`,
`contest_date`. Functional (LeetCode) inputs are newline-separated JSON arguments, outputs JSON.
APPS/TACO rows: `question`, `input_output` (JSON text: `inputs`, `outputs`, optional `fn_name`;
call-based outputs wrapped in a one-element list as APPS stores them, or bare as TACO's LeetCode
rows do), `starter_code`. The tests are those of the public problems (statement examples plus a few
more cases computed with the reference solutions below); APPS problem 2403 (a float answer) is written
for this fixture in APPS's layout, to exercise APPS's float tolerance.

Run with any python3 >= 3.8:  python3 scripts/gen-code-fixtures.py
"""
import base64
import json
import os
import pickle
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "rewards", "code")


def blob(cases):
    """LiveCodeBench's private_test_cases encoding."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


def functional(args, out):
    return {"input": "\n".join(json.dumps(a) for a in args), "output": json.dumps(out), "testtype": "functional"}


def stdin(inp, out):
    return {"input": inp, "output": out, "testtype": "stdin"}


# Reference solutions: every expected output below is checked against them.
def two_sum(nums, target):
    seen = {}
    for i, x in enumerate(nums):
        if target - x in seen:
            return [seen[target - x], i]
        seen[x] = i


def is_fascinating(n):
    s = str(n) + str(2 * n) + str(3 * n)
    return len(s) == 9 and set(s) == set("123456789")


def longest_common_prefix(strs):
    p = strs[0]
    for s in strs[1:]:
        while not s.startswith(p):
            p = p[:-1]
    return p


LCB = [
    {
        "question_title": "two-sum",
        "question_content": "Given an array of integers nums and an integer target, return indices of the two "
        "numbers such that they add up to target. You may assume that each input would have exactly one "
        "solution, and you may not use the same element twice. Return the answer in increasing index order.",
        "platform": "leetcode",
        "question_id": "1",
        "contest_id": "leetcode-1",
        "contest_date": "2023-08-01T00:00:00",
        "starter_code": "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n        ",
        "difficulty": "easy",
        "public": [([[2, 7, 11, 15], 9],), ([[3, 2, 4], 6],)],
        "private": [([[3, 3], 6],), ([[-1, -2, -3, -4, -5], -8],), ([[0, 4, 3, 0], 0],)],
        "fn": two_sum,
        "func_name": "twoSum",
    },
    {
        "question_title": "check-if-the-number-is-fascinating",
        "question_content": "You are given an integer n that consists of exactly 3 digits. We call the number n "
        "fascinating if, after concatenating n with the numbers 2 * n and 3 * n, the resulting number contains "
        "all the digits from 1 to 9 exactly once and does not contain any 0's. Return true if n is "
        "fascinating, or false otherwise.",
        "platform": "leetcode",
        "question_id": "2824",
        "contest_id": "biweekly-contest-106",
        "contest_date": "2023-06-10T00:00:00",
        "starter_code": "class Solution:\n    def isFascinating(self, n: int) -> bool:\n        ",
        "difficulty": "easy",
        "public": [([192],), ([100],)],
        "private": [([273],), ([327],), ([219],), ([111],)],
        "fn": is_fascinating,
        "func_name": "isFascinating",
    },
    {
        "question_title": "longest-common-prefix",
        "question_content": "Write a function to find the longest common prefix string amongst an array of "
        "strings. If there is no common prefix, return an empty string \"\".",
        "platform": "leetcode",
        "question_id": "14",
        "contest_id": "leetcode-14",
        "contest_date": "2023-08-02T00:00:00",
        "starter_code": "class Solution:\n    def longestCommonPrefix(self, strs: List[str]) -> str:\n        ",
        "difficulty": "easy",
        "public": [([["flower", "flow", "flight"]],), ([["dog", "racecar", "car"]],)],
        "private": [([["a"]],), ([["ab", "a"]],)],
        "fn": longest_common_prefix,
        "func_name": "longestCommonPrefix",
    },
    {
        "question_title": "Product",
        "question_content": "AtCoDeer the deer found two positive integers, a and b. Determine whether the "
        "product of a and b is even or odd.\n\nInput\n\na b\n\nOutput\n\nIf the product is odd, print Odd; "
        "if it is even, print Even.",
        "platform": "atcoder",
        "question_id": "abc086_a",
        "contest_id": "abc086",
        "contest_date": "2023-08-03T00:00:00",
        "starter_code": "",
        "difficulty": "easy",
        "public": [stdin("3 4\n", "Even\n"), stdin("1 21\n", "Odd\n")],
        "private": [stdin("10000 9999\n", "Even\n"), stdin("7 9\n", "Odd\n")],
    },
    {
        "question_title": "Entrance Examination",
        "question_content": "In World A, time passes X times as fast as in our world. How many hours pass in "
        "World B while Taro studies for T hours in World A?\n\nInput\n\nT X\n\nOutput\n\nPrint the number "
        "of hours (absolute or relative error at most 10^{-3}).",
        "platform": "atcoder",
        "question_id": "abc117_a",
        "contest_id": "abc117",
        "contest_date": "2023-08-04T00:00:00",
        "starter_code": "",
        "difficulty": "easy",
        "public": [stdin("8 3\n", "2.6666666667\n"), stdin("99 1\n", "99.0000000000\n")],
        "private": [stdin("1 100\n", "0.0100000000\n")],
    },
]


def lcb_rows():
    rows = []
    for p in LCB:
        if "fn" in p:
            fn = p["fn"]
            public = [functional(args, fn(*args)) for (args,) in p["public"]]
            private = [functional(args, fn(*args)) for (args,) in p["private"]]
            meta = {"func_name": p["func_name"]}
        else:
            public, private, meta = p["public"], p["private"], {}
        row = {k: v for k, v in p.items() if k not in ("public", "private", "fn", "func_name")}
        row["public_test_cases"] = json.dumps(public)
        row["private_test_cases"] = blob(private)
        row["metadata"] = json.dumps(meta)
        rows.append(row)
    return rows


def even_or_odd(n):
    return "Even" if n % 2 == 0 else "Odd"


def digitize(n):
    return [int(d) for d in str(n)][::-1]


def max_profit(prices):
    best, low = 0, prices[0]
    for p in prices:
        low = min(low, p)
        best = max(best, p - low)
    return best


APPS = [
    {
        "problem_id": 2400,
        "question": "Create a function that takes an integer as an argument and returns \"Even\" for even "
        "numbers or \"Odd\" for odd numbers.",
        "starter_code": "def even_or_odd(number):\n\t",
        "fn_name": "even_or_odd",
        "fn": even_or_odd,
        "wrap": True,
        "inputs": [[2], [7], [-42], [-7], [0]],
        "url": "https://www.codewars.com/kata/53da3dbb4a5168369a0000fe",
    },
    {
        "problem_id": 2401,
        "question": "Convert number to reversed array of digits. Given a random non-negative number, you have "
        "to return the digits of this number within an array in reverse order.",
        "starter_code": "def digitize(n):\n\t",
        "fn_name": "digitize",
        "fn": digitize,
        "wrap": True,
        "inputs": [[35231], [0], [23582357]],
        "url": "https://www.codewars.com/kata/5583090cbe83f4fd8c000051",
    },
    {
        "problem_id": 2402,
        "question": "You are given an array prices where prices[i] is the price of a given stock on the ith "
        "day. Return the maximum profit you can achieve from one transaction (buy one day, sell a later "
        "day). If you cannot achieve any profit, return 0.",
        "starter_code": "class Solution:\n    def maxProfit(self, prices: List[int]) -> int:\n        ",
        "fn_name": "maxProfit",
        "fn": max_profit,
        "wrap": False,
        "inputs": [[[7, 1, 5, 3, 6, 4]], [[7, 6, 4, 3, 1]], [[2, 4, 1]]],
        "url": "https://leetcode.com/problems/best-time-to-buy-and-sell-stock/",
    },
    {
        "problem_id": 2403,
        "question": "Given two integers a and b on one line, print a / b.\n\nYour answer is accepted if its "
        "absolute or relative error is at most 10^{-6}.",
        "starter_code": "",
        "stdin": [("1 3\n", "0.3333333333\n"), ("10 4\n", "2.5\n")],
        "url": "",
    },
    {
        "problem_id": 2404,
        "question": "One hot summer day Pete and his friend Billy decided to buy a watermelon of weight w "
        "kilos. They want to divide it into two parts, each weighing an even number of kilos (not necessarily "
        "equal; each part of positive weight). Print YES if they can, NO otherwise.",
        "starter_code": "",
        "stdin": [("8\n", "YES\n"), ("5\n", "NO\n"), ("2\n", "NO\n"), ("100\n", "YES\n")],
        "url": "https://codeforces.com/problemset/problem/4/A",
    },
]


def apps_rows():
    rows = []
    for p in APPS:
        if "fn" in p:
            outs = [p["fn"](*args) for args in p["inputs"]]
            io = {"fn_name": p["fn_name"], "inputs": p["inputs"],
                  "outputs": [[o] for o in outs] if p["wrap"] else outs}
        else:
            io = {"inputs": [i for i, _ in p["stdin"]], "outputs": [o for _, o in p["stdin"]]}
        rows.append({
            "problem_id": p["problem_id"],
            "question": p["question"],
            "solutions": "[]",
            "input_output": json.dumps(io),
            "difficulty": "introductory",
            "url": p["url"],
            "starter_code": p["starter_code"],
        })
    return rows


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, rows in [("livecodebench_real.jsonl", lcb_rows()), ("apps_real.jsonl", apps_rows())]:
        with open(os.path.join(OUT, name), "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        print(f"wrote {len(rows)} rows to {name}")


if __name__ == "__main__":
    main()
