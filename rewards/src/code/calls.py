# Call-based tests (LiveCodeBench "functional", APPS/TACO `fn_name`), run inside the sandbox as
# `python3 -I -S -B calls.py RESULT_FD FN_NAME TIMEOUT_S`, with program.py and cases.json in cwd.
#
# The expected values never reach the untrusted program:
#   * the checker (this process) opens cases.json, unlinks it, makes itself non-dumpable and forks
#     the loader before reading it, so the loader (and the program it runs) has neither the file
#     nor its contents in memory, and cannot read the checker's descriptors or memory;
#   * the loader closes the cases descriptor and RESULT_FD, points stdin/stdout/stderr at
#     /dev/null (so the run ends as soon as the checker has its verdict), runs
#     a LiveCodeBench-style import preamble and then program.py (as module `solution`, so a
#     `__main__` block does not run), then answers calls: for each call it forks a child that
#     resolves the function (a method of a fresh `Solution()` when the program defines `class
#     Solution`, as LiveCodeBench and APPS do; else a module-level function), calls it with the
#     arguments, and sends back the result encoded with `marshal` (exact builtin types only);
#   * the checker compares the returned plain data with the expected value and writes a one-line
#     JSON verdict to RESULT_FD. A call that does not answer within TIMEOUT_S fails the test.
#
# Case forms (cases.json: {"cases": [{"form": "lcb" | "apps", "input": ..., "output": ...}]}):
#   * lcb:  `input` is newline-separated JSON, one argument per line; `output` is JSON text.
#           Pass iff result == expected (LiveCodeBench lcb_runner/evaluation/testing_util.py,
#           grade_call_based: a tuple result becomes a list first).
#   * apps: `input` is the list of arguments; `output` the expected value. Pass iff result ==
#           output, or output is a non-empty list and result == output[0] (APPS
#           eval/testing_util.py run_test, call-based branch; tuples become lists). JSON's string
#           keys are turned back into ints for a dict argument/output, as APPS does.
import json
import marshal
import os
import select
import struct
import sys
from time import monotonic

RESULT_FD = int(sys.argv[1])
FN_NAME = sys.argv[2]
TIMEOUT = float(sys.argv[3])
PLAIN = (type(None), bool, int, float, complex, str, bytes)
MAX_REPLY = 64 << 20

# LiveCodeBench's import string (names star-imported into the program's namespace), ending with
# builtins so that `math.pow` does not shadow `pow`.
PREAMBLE = """
from string import *
from re import *
from datetime import *
from collections import *
from heapq import *
from bisect import *
from copy import *
from math import *
from random import *
from statistics import *
from itertools import *
from functools import *
from operator import *
from io import *
from sys import *
from json import *
from builtins import *
from typing import *
import string, re, datetime, collections, heapq, bisect, copy, math, random, statistics
import itertools, functools, operator, io, sys, json
sys.setrecursionlimit(50000)
"""


def send(fd, obj):
    data = marshal.dumps(obj)
    data = struct.pack("<Q", len(data)) + data
    while data:
        n = os.write(fd, data)
        data = data[n:]


def recv_exact(fd, n, deadline=None):
    chunks = []
    while n:
        if deadline is not None:
            left = deadline - monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError()
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("program exited")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv(fd, deadline=None):
    (n,) = struct.unpack("<Q", recv_exact(fd, 8, deadline))
    if n > MAX_REPLY:
        raise ValueError("reply of %d bytes" % n)
    return marshal.loads(recv_exact(fd, n, deadline))


def plain(value, depth=0):
    if depth > 200:
        return False
    t = type(value)
    if t in PLAIN:
        return True
    if t in (list, tuple, set, frozenset):
        return all(plain(v, depth + 1) for v in value)
    if t is dict:
        return all(plain(k, depth + 1) and plain(v, depth + 1) for k, v in value.items())
    return False


def loader(req_fd, resp_fd):
    # The program holds none of the sandbox's pipes, so the run ends when the checker exits.
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    namespace = {"__name__": "solution"}
    try:
        with open("program.py") as f:
            source = f.read()
        exec(PREAMBLE, namespace)
        exec(compile(source, "program.py", "exec"), namespace)
    except BaseException as e:  # the program failed to load: report and stop
        send(resp_fd, ("dead", type(e).__name__ + ": " + str(e)[:300]))
        os._exit(1)
    use_class = "class Solution" in source and isinstance(namespace.get("Solution"), type)
    send(resp_fd, ("ready",))
    while True:
        try:
            args = recv(req_fd)
        except EOFError:
            os._exit(0)
        pid = os.fork()
        if pid:
            _, status = os.waitpid(pid, 0)
            if status != 0:
                # The child died before answering (a crash, a kill by a limit, or a program that
                # exits): answer for it so the checker fails the test at once.
                send(resp_fd, ("error", "the call ended the process (wait status %d)" % status))
            continue
        os.close(req_fd)
        try:
            if use_class:
                fn = getattr(namespace["Solution"](), FN_NAME)
            else:
                fn = namespace[FN_NAME]
        except BaseException as e:
            reply = ("error", "missing entry point `%s` (%s)" % (FN_NAME, type(e).__name__))
        else:
            try:
                reply = ("value", fn(*args))
            except BaseException as e:
                reply = ("error", type(e).__name__ + ": " + str(e)[:300])
        try:
            data = marshal.dumps(reply)
        except BaseException as e:
            data = marshal.dumps(("error", "the result is not plain data (%s)" % type(e).__name__))
        data = struct.pack("<Q", len(data)) + data
        while data:
            data = data[os.write(resp_fd, data):]
        os._exit(0)


def listify(value):
    """Tuples become lists, recursively (the ground truth is JSON, which has no tuples)."""
    if type(value) in (list, tuple):
        return [listify(v) for v in value]
    if type(value) is dict:
        return {k: listify(v) for k, v in value.items()}
    return value


def int_keys(value):
    """APPS: a dict (or a list holding one dict first) gets its JSON string keys back as ints."""
    try:
        if isinstance(value, dict):
            return {int(k): v for k, v in value.items()}
        if isinstance(value, list) and value and isinstance(value[0], dict):
            return [{int(k): v for k, v in value[0].items()}]
    except (TypeError, ValueError):
        pass
    return value


def short(value):
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def verdict(passed, total, failure=None):
    out = {"passed": passed, "total": total}
    if failure is not None:
        out["failure"] = failure
    os.write(RESULT_FD, json.dumps(out).encode()[:4000])
    os._exit(0)


def make_undumpable():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_DUMPABLE = 4
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")


def main():
    cases_fd = os.open("cases.json", os.O_RDONLY | os.O_CLOEXEC)
    os.unlink("cases.json")
    make_undumpable()
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(cases_fd)
        os.close(RESULT_FD)
        os.close(req_w)
        os.close(resp_r)
        loader(req_r, resp_w)
        os._exit(0)
    os.close(req_r)
    os.close(resp_w)
    with os.fdopen(cases_fd, "rb") as f:
        cases = json.loads(f.read())["cases"]
    total = len(cases)
    try:
        hello = recv(resp_r, monotonic() + TIMEOUT)
    except TimeoutError:
        verdict(0, total, {"test": 0, "error": "timed out loading the program"})
    except Exception as e:
        verdict(0, total, {"test": 0, "error": "program failed to load: %s" % type(e).__name__})
    if hello != ("ready",):
        why = hello[1] if type(hello) is tuple and len(hello) == 2 and type(hello[1]) is str else "?"
        verdict(0, total, {"test": 0, "error": "program failed to load: " + why})
    for i, case in enumerate(cases):
        if case["form"] == "lcb":
            args = [json.loads(line) for line in case["input"].split("\n")]
            expected = json.loads(case["output"])
            accepted = [expected]
        else:
            args = int_keys(case["input"])
            expected = int_keys(case["output"])
            accepted = [expected]
            if isinstance(expected, list) and expected:
                accepted.append(expected[0])
        try:
            send(req_w, args)
            reply = recv(resp_r, monotonic() + TIMEOUT)
        except TimeoutError:
            verdict(i, total, {"test": i, "error": "timed out after %gs" % TIMEOUT})
        except Exception as e:
            verdict(i, total, {"test": i, "error": "no reply from the program: %s" % type(e).__name__})
        if not plain(reply) or type(reply) is not tuple or len(reply) != 2:
            verdict(i, total, {"test": i, "error": "malformed reply from the program"})
        if reply[0] == "error":
            verdict(i, total, {"test": i, "error": str(reply[1])[:300]})
        if reply[0] != "value":
            verdict(i, total, {"test": i, "error": "malformed reply from the program"})
        got = listify(reply[1])
        if not any(got == want for want in accepted):
            verdict(i, total, {"test": i, "error": "wrong answer", "got": short(got), "expected": short(expected)})
    verdict(total, total)


try:
    main()
except BaseException as e:
    sys.stderr.write("calls harness failed: %s: %s\n" % (type(e).__name__, str(e)[:500]))
    os._exit(2)
