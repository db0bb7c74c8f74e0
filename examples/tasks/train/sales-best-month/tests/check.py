"""Checks the workspace against expected.json. Exit 0 = correct, 1 = wrong.

Nothing the candidate wrote runs in this process: files are read without following links or opening FIFOs and
devices, with a size cap; a function the candidate wrote is called in a child process (under $RUN_CANDIDATE when
the sandbox provides it) that prints its results as JSON, and they are compared here.
"""

import csv
import json
import math
import os
import stat
import subprocess
import sys

MAX_BYTES = 10 * 1024 * 1024
CALL_TIMEOUT_S = 20

# Run in the child: load solution.py, call the function on each case, print one JSON line of results.
CALLER = """
import importlib.util, json, sys
cases = json.loads(sys.stdin.read())
spec = importlib.util.spec_from_file_location("solution", "solution.py")
module = importlib.util.module_from_spec(spec)
try:
    spec.loader.exec_module(module)
    fn = getattr(module, sys.argv[1])
except BaseException as e:
    print("\\n" + json.dumps({"load": repr(e)}))
    sys.exit(0)
out = []
for args in cases:
    try:
        got = fn(*args)
        out.append({"ok": list(got) if isinstance(got, tuple) else got})
    except Exception as e:
        out.append({"raised": repr(e)})
print("\\n" + json.dumps({"results": out}, default=repr))
"""


def wrong(msg):
    print("WRONG:", msg)
    sys.exit(1)


def read(name):
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        wrong(f"{name} was not written (or is not a regular file)")
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTES:
            wrong(f"{name} is not a regular file of at most {MAX_BYTES} bytes")
        return fh.read(MAX_BYTES).decode(errors="replace")


def same(a, b, tol):
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, abs_tol=tol)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y, tol) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], tol) for k in a)
    return a == b


def call_candidate(function, cases):
    """The candidate's function on each case, computed in a child process; its results as data."""
    read("solution.py")
    prefix = [os.environ["RUN_CANDIDATE"]] if os.environ.get("RUN_CANDIDATE") else []
    try:
        proc = subprocess.run([*prefix, sys.executable, "-I", "-c", CALLER, function], input=json.dumps(cases),
                              capture_output=True, text=True, timeout=CALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        wrong(f"{function} did not return within {CALL_TIMEOUT_S}s")
    last = proc.stdout.rstrip("\n").rpartition("\n")[2]
    try:
        reply = json.loads(last)
    except json.JSONDecodeError:
        wrong(f"solution.py gave no result (exit code {proc.returncode}): {proc.stderr[-300:]}")
    if not isinstance(reply, dict) or "results" not in reply:
        wrong(f"solution.py does not load or lacks {function}: {reply.get('load') if isinstance(reply, dict) else reply}")
    results = reply["results"]
    if not isinstance(results, list) or len(results) != len(cases):
        wrong("solution.py gave a malformed result")
    return results


def main():
    with open(sys.argv[1]) as fh:
        exp = json.load(fh)
    kind, tol = exp["kind"], exp.get("tol", 1e-6)
    if kind == "number":
        text = read("answer.txt").strip()
        try:
            got = float(text)
        except ValueError:
            wrong(f"answer.txt is not a number: {text[:40]!r}")
        if not math.isclose(got, exp["value"], abs_tol=tol):
            wrong(f"answer {got} is not {exp['value']}")
    elif kind == "text":
        got = read("answer.txt").strip()
        if got.lower() != str(exp["value"]).lower():
            wrong(f"answer {got[:40]!r} is not {exp['value']!r}")
    elif kind == "lines":
        got = read(exp["file"]).splitlines()
        if got != exp["value"]:
            wrong(f"{exp['file']} has the wrong lines")
    elif kind == "csv":
        rows = list(csv.reader(read(exp["file"]).splitlines()))
        if rows != exp["value"]:
            wrong(f"{exp['file']} has the wrong rows")
    elif kind == "json":
        try:
            got = json.loads(read(exp["file"]))
        except json.JSONDecodeError as e:
            wrong(f"{exp['file']} is not JSON: {e}")
        if not same(got, exp["value"], tol):
            wrong(f"{exp['file']} has the wrong content")
    elif kind == "code":
        cases = exp["cases"]
        results = call_candidate(exp["function"], [args for args, _ in cases])
        for (args, want), result in zip(cases, results, strict=True):
            if not isinstance(result, dict) or "ok" not in result:
                wrong(f"{exp['function']}{tuple(args)} raised {result.get('raised') if isinstance(result, dict) else result}")
            if not same(result["ok"], want, tol):
                wrong(f"{exp['function']}{tuple(args)} = {result['ok']!r}, expected {want!r}")
    else:
        print("unknown check kind", kind)
        sys.exit(2)
    print("CORRECT")


main()
