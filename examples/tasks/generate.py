"""Generate the example task set (Harbor format) in this directory: `python examples/tasks/generate.py`.

Every task is written for harnessrl: small Python and data-analysis problems with their data files, a verifier
(tests/test.sh -> tests/check.py, stdlib only) and the expected result, computed here from the same data.
tests/unit/test_runner_tasks.py checks that the committed tree equals what this script writes.
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
import shutil
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent

TEST_SH = """#!/usr/bin/env bash
# Verifier (Harbor layout): the workspace is the cwd, tests/ is at $TESTS_DIR, the reward goes to
# $LOGS_DIR/verifier/reward.txt. Defaults are Harbor's container paths. The checker runs on an absolute
# interpreter in isolated mode ($PYTHON, -I: no workspace or user site on its import path); the candidate's
# code runs in a process of its own (check.py, through $RUN_CANDIDATE where the sandbox provides it).
set -u
LOGS="${LOGS_DIR:-/logs}"
TESTS="${TESTS_DIR:-/tests}"
cd "${WORKSPACE:-/workspace}"
mkdir -p "$LOGS/verifier"
"${PYTHON:-python3}" -I "$TESTS/check.py" "$TESTS/expected.json"
status=$?
# 0: correct, 1: wrong; anything else means the verifier itself broke, so no reward is written.
case $status in
  0) echo 1 > "$LOGS/verifier/reward.txt" ;;
  1) echo 0 > "$LOGS/verifier/reward.txt" ;;
  *) exit $status ;;
esac
"""

SOLVE_SH = """#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${{WORKSPACE:-/workspace}}"
python3 - <<'PY'
{code}PY
"""

CHECK_PY = '''\"\"\"Checks the workspace against expected.json. Exit 0 = correct, 1 = wrong.

Nothing the candidate wrote runs in this process: files are read without following links or opening FIFOs and
devices, with a size cap; a function the candidate wrote is called in a child process (under $RUN_CANDIDATE when
the sandbox provides it) that prints its results as JSON, and they are compared here.
\"\"\"

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
CALLER = \"\"\"
import importlib.util, json, sys
cases = json.loads(sys.stdin.read())
spec = importlib.util.spec_from_file_location("solution", "solution.py")
module = importlib.util.module_from_spec(spec)
try:
    spec.loader.exec_module(module)
    fn = getattr(module, sys.argv[1])
except BaseException as e:
    print("\\\\n" + json.dumps({"load": repr(e)}))
    sys.exit(0)
out = []
for args in cases:
    try:
        got = fn(*args)
        out.append({"ok": list(got) if isinstance(got, tuple) else got})
    except Exception as e:
        out.append({"raised": repr(e)})
print("\\\\n" + json.dumps({"results": out}, default=repr))
\"\"\"


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
    \"\"\"The candidate's function on each case, computed in a child process; its results as data.\"\"\"
    read("solution.py")
    prefix = [os.environ["RUN_CANDIDATE"]] if os.environ.get("RUN_CANDIDATE") else []
    try:
        proc = subprocess.run([*prefix, sys.executable, "-I", "-c", CALLER, function], input=json.dumps(cases),
                              capture_output=True, text=True, timeout=CALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        wrong(f"{function} did not return within {CALL_TIMEOUT_S}s")
    last = proc.stdout.rstrip("\\n").rpartition("\\n")[2]
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
'''


@dataclass
class Spec:
    name: str
    instruction: str
    expected: dict[str, Any]
    files: dict[str, str] = field(default_factory=dict)
    category: str = "data-analysis"
    difficulty: str = "easy"


def table(header: list[str], rows: list[list[Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue()


NUMBER_NOTE = "Write only the number to a file named `answer.txt` in the current directory."
TEXT_NOTE = "Write only that value to a file named `answer.txt` in the current directory."


def data_specs() -> list[Spec]:
    rng = random.Random(20261129)
    regions = ["north", "south", "east", "west"]
    customers = [f"c{i:02d}" for i in range(1, 13)]
    sales = [
        [f"o{i:03d}", rng.choice(customers), rng.choice(regions), f"2026-{rng.randint(1, 6):02d}-{rng.randint(1, 28):02d}", rng.randint(5, 250)]
        for i in range(1, 41)
    ]
    sales_csv = table(["order_id", "customer", "region", "date", "amount"], sales)
    amounts = [r[4] for r in sales]
    by_region = Counter[str]()
    by_month = Counter[str]()
    for r in sales:
        by_region[r[2]] += r[4]
        by_month[r[3][:7]] += r[4]
    names = ["ana", "ben", "cho", "dev", "eli", "fay", "gus", "hal", "ivy", "jon", "kai", "lea", "max"]
    people = [[n, rng.randint(18, 80), rng.choice(["paris", "lima", "oslo", "kyiv"])] for n in names]
    people_csv = table(["name", "age", "city"], people)
    inventory = [
        {"sku": f"s{i}", "qty": rng.randint(0, 30), "price": round(rng.uniform(1, 40), 2), "tags": rng.sample(["sale", "new", "eco", "bulk"], 2)}
        for i in range(1, 16)
    ]
    ips = [f"10.0.0.{rng.randint(1, 6)}" for _ in range(60)]
    levels = [rng.choice(["INFO", "INFO", "WARN", "ERROR"]) for _ in range(50)]
    app_log = "".join(f"2026-11-29T10:{i:02d}:00 {lvl} worker-{i % 3} step {i}\n" for i, lvl in enumerate(levels))
    access_log = "".join(f'{ip} - - [29/Nov/2026:10:{i:02d}:00] "GET /p{i % 7} HTTP/1.1" 200 {100 + i}\n' for i, ip in enumerate(ips))
    words = ["data", "model", "agent", "tool", "harness", "proxy", "token", "reward"]
    text = " ".join(rng.choice(words) for _ in range(120)) + "\n"
    temps = [round(rng.uniform(-5, 30), 1) for _ in range(24)]
    xs = [rng.randint(0, 50) for _ in range(20)]
    ys = [2 * x + rng.randint(-10, 10) for x in xs]
    scores = [[f"s{i:02d}", rng.randint(20, 100)] for i in range(1, 26)]
    weighted = [[f"item{i}", rng.randint(50, 100), rng.randint(1, 5)] for i in range(1, 9)]
    messy = [[str(i), rng.choice(["", str(rng.randint(1, 9))]), rng.choice(["", "x", "y"])] for i in range(1, 16)]
    emails = [f"{rng.choice(names)}@{rng.choice(['a.org', 'b.com', 'c.net', 'd.io'])}" for _ in range(20)]
    nested = {"a": [1, 2, {"b": 3.5, "c": [4, {"d": 5}]}], "e": {"f": 6, "g": [7, 8.25]}, "h": "skip", "i": True}
    module_py = "".join(f"def f{i}(x):\n    return x + {i}\n\n\n" for i in range(7)) + "class K:\n    def m(self):\n        return 1\n"
    dup_lines = [rng.choice(["alpha", "beta", "gamma", "delta", "eps"]) for _ in range(18)]

    def nested_sum(v: Any) -> float:
        if isinstance(v, bool | str):
            return 0.0
        if isinstance(v, int | float):
            return float(v)
        items = v.values() if isinstance(v, dict) else v
        return sum(nested_sum(x) for x in items)

    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    corr = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / math.sqrt(
        sum((x - mean_x) ** 2 for x in xs) * sum((y - mean_y) ** 2 for y in ys)
    )
    oldest = max(people, key=lambda p: p[1])
    sales_file = {"sales.csv": sales_csv}
    people_file = {"people.csv": people_csv}
    return [
        Spec("sales-total", f"`sales.csv` lists orders. What is the sum of the `amount` column? {NUMBER_NOTE}",
             {"kind": "number", "value": sum(amounts)}, sales_file),
        Spec("sales-mean", f"`sales.csv` lists orders. What is the mean of the `amount` column, rounded to 2 decimals? {NUMBER_NOTE}",
             {"kind": "number", "value": round(statistics.fmean(amounts), 2), "tol": 0.006}, sales_file),
        Spec("sales-top-region", f"`sales.csv` lists orders. Which region has the largest total `amount`? {TEXT_NOTE}",
             {"kind": "text", "value": by_region.most_common(1)[0][0]}, sales_file),
        Spec("sales-large-orders", f"`sales.csv` lists orders. How many orders have an `amount` greater than 100? {NUMBER_NOTE}",
             {"kind": "number", "value": sum(a > 100 for a in amounts)}, sales_file),
        Spec("sales-distinct-customers", f"`sales.csv` lists orders. How many distinct customers placed orders? {NUMBER_NOTE}",
             {"kind": "number", "value": len({r[1] for r in sales})}, sales_file),
        Spec("sales-best-month", f"`sales.csv` lists orders with dates. Which month (as `YYYY-MM`) has the largest total `amount`? {TEXT_NOTE}",
             {"kind": "text", "value": by_month.most_common(1)[0][0]}, sales_file),
        Spec("people-median-age", f"`people.csv` lists people. What is the median `age`? {NUMBER_NOTE}",
             {"kind": "number", "value": statistics.median(p[1] for p in people), "tol": 0.001}, people_file),
        Spec("people-oldest", f"`people.csv` lists people. What is the `name` of the oldest person? {TEXT_NOTE}",
             {"kind": "text", "value": oldest[0]}, people_file),
        Spec("inventory-value", f"`inventory.json` is a list of items with `qty` and `price`. What is the total stock value (sum of qty × price), rounded to 2 decimals? {NUMBER_NOTE}",
             {"kind": "number", "value": round(sum(i["qty"] * i["price"] for i in inventory), 2), "tol": 0.006},
             {"inventory.json": json.dumps(inventory, indent=1) + "\n"}),
        Spec("inventory-sale-tag", f"`inventory.json` is a list of items with `tags`. How many items carry the tag `sale`? {NUMBER_NOTE}",
             {"kind": "number", "value": sum("sale" in i["tags"] for i in inventory)},
             {"inventory.json": json.dumps(inventory, indent=1) + "\n"}),
        Spec("log-error-count", f"`app.log` is an application log. How many lines have the level `ERROR`? {NUMBER_NOTE}",
             {"kind": "number", "value": levels.count("ERROR")}, {"app.log": app_log}),
        Spec("log-top-ip", f"`access.log` is a web server log. Which client IP address made the most requests? {TEXT_NOTE}",
             {"kind": "text", "value": Counter(ips).most_common(1)[0][0]}, {"access.log": access_log}),
        Spec("text-word-count", f"How many words (separated by whitespace) does `text.txt` contain? {NUMBER_NOTE}",
             {"kind": "number", "value": len(text.split())}, {"text.txt": text}),
        Spec("text-common-word", f"Which word occurs most often in `text.txt`? {TEXT_NOTE}",
             {"kind": "text", "value": Counter(text.split()).most_common(1)[0][0]}, {"text.txt": text}),
        Spec("temps-stddev", f"`temps.csv` has hourly temperatures. What is their population standard deviation, rounded to 2 decimals? {NUMBER_NOTE}",
             {"kind": "number", "value": round(statistics.pstdev(temps), 2), "tol": 0.006},
             {"temps.csv": table(["hour", "temp"], [[h, t] for h, t in enumerate(temps)])}),
        Spec("xy-correlation", f"`xy.csv` has columns `x` and `y`. What is their Pearson correlation coefficient, rounded to 3 decimals? {NUMBER_NOTE}",
             {"kind": "number", "value": round(corr, 3), "tol": 0.0006},
             {"xy.csv": table(["x", "y"], [list(p) for p in zip(xs, ys, strict=True)])}, difficulty="medium"),
        Spec("missing-cells", f"`data.csv` has some empty cells. How many cells (not counting the header) are empty? {NUMBER_NOTE}",
             {"kind": "number", "value": sum(c == "" for row in messy for c in row)},
             {"data.csv": table(["id", "value", "flag"], messy)}),
        Spec("email-domains", f"`emails.txt` has one email address per line. How many distinct domains appear? {NUMBER_NOTE}",
             {"kind": "number", "value": len({e.split("@")[1] for e in emails})}, {"emails.txt": "\n".join(emails) + "\n"}),
        Spec("pass-rate", f"`scores.csv` lists students' scores. What percentage of students scored 60 or more, rounded to 1 decimal? {NUMBER_NOTE}",
             {"kind": "number", "value": round(100 * sum(s >= 60 for _, s in scores) / len(scores), 1), "tol": 0.051},
             {"scores.csv": table(["student", "score"], scores)}),
        Spec("weighted-mean", f"`weighted.csv` has a `score` and a `weight` per item. What is the weighted mean score, rounded to 2 decimals? {NUMBER_NOTE}",
             {"kind": "number", "value": round(sum(s * w for _, s, w in weighted) / sum(w for *_, w in weighted), 2), "tol": 0.006},
             {"weighted.csv": table(["item", "score", "weight"], weighted)}),
        Spec("count-functions", f"How many top-level functions (not methods) does `module.py` define? {NUMBER_NOTE}",
             {"kind": "number", "value": 7}, {"module.py": module_py}, category="python"),
        Spec("nested-sum", f"`nested.json` holds nested lists and objects. What is the sum of all numbers in it (booleans and strings are not numbers)? {NUMBER_NOTE}",
             {"kind": "number", "value": nested_sum(nested), "tol": 1e-6}, {"nested.json": json.dumps(nested) + "\n"}, difficulty="medium"),
        Spec("filter-north", "`sales.csv` lists orders. Write `north.csv` with the header and only the rows whose `region` is `north`, in their original order.",
             {"kind": "csv", "file": "north.csv", "value": [["order_id", "customer", "region", "date", "amount"]] + [[str(c) for c in r] for r in sales if r[2] == "north"]},
             sales_file),
        Spec("sort-by-amount", "`sales.csv` lists orders. Write `sorted.csv` with the same header and rows sorted by `amount`, largest first (ties: by `order_id` ascending).",
             {"kind": "csv", "file": "sorted.csv", "value": [["order_id", "customer", "region", "date", "amount"]] + [[str(c) for c in r] for r in sorted(sales, key=lambda r: (-r[4], r[0]))]},
             sales_file, difficulty="medium"),
        Spec("region-totals", "`sales.csv` lists orders. Write `totals.json`: a JSON object mapping each region to its total `amount` (a number).",
             {"kind": "json", "file": "totals.json", "value": dict(sorted(by_region.items()))}, sales_file),
        Spec("csv-to-json", "Convert `people.csv` to `people.json`: a JSON list of objects with keys `name`, `age` (an integer) and `city`, in the file's order.",
             {"kind": "json", "file": "people.json", "value": [{"name": n, "age": a, "city": c} for n, a, c in people]}, people_file),
        Spec("dedupe-lines", "Write `unique.txt` with the lines of `lines.txt` without repeats, keeping each line's first occurrence in order.",
             {"kind": "lines", "file": "unique.txt", "value": list(dict.fromkeys(dup_lines))}, {"lines.txt": "\n".join(dup_lines) + "\n"}),
    ]


def code(name: str, signature: str, doc: str, cases: list[tuple[list[Any], Any]], difficulty: str = "easy") -> Spec:
    fn = signature.split("(")[0]
    return Spec(
        name,
        f"Write `solution.py` in the current directory defining `{signature}`: {doc}",
        {"kind": "code", "function": fn, "cases": [[list(a), w] for a, w in cases]},
        category="python",
        difficulty=difficulty,
    )


def code_specs() -> list[Spec]:
    fizz = ["1", "2", "Fizz", "4", "Buzz", "Fizz", "7", "8", "Fizz", "Buzz", "11", "Fizz", "13", "14", "FizzBuzz"]
    return [
        code("fizzbuzz", "fizzbuzz(n)", "return a list of strings for 1..n where multiples of 3 are `Fizz`, of 5 `Buzz`, of both `FizzBuzz`, others the number.",
             [([15], fizz), ([1], ["1"]), ([0], [])]),
        code("palindrome", "is_palindrome(s)", "return True if `s` reads the same backwards, ignoring case and non-alphanumeric characters.",
             [(["A man, a plan, a canal: Panama"], True), (["harness"], False), ([""], True), (["No 'x' in Nixon"], True)]),
        code("fibonacci", "fib(n)", "return the n-th Fibonacci number with fib(0) = 0 and fib(1) = 1.",
             [([0], 0), ([1], 1), ([10], 55), ([50], 12586269025)]),
        code("primes", "primes_up_to(n)", "return the sorted list of primes ≤ n.",
             [([1], []), ([2], [2]), ([30], [2, 3, 5, 7, 11, 13, 17, 19, 23, 29])]),
        code("word-freq", "word_freq(text)", "return a dict mapping each lowercase word (split on whitespace) to its count.",
             [(["a B a"], {"a": 2, "b": 1}), ([""], {})]),
        code("flatten", "flatten(xs)", "return a flat list of the non-list items of an arbitrarily nested list, in order.",
             [([[1, [2, [3, []], 4], 5]], [1, 2, 3, 4, 5]), ([[]], [])]),
        code("roman-to-int", "roman_to_int(s)", "convert a Roman numeral to an integer.",
             [(["III"], 3), (["MCMXCIV"], 1994), (["XLII"], 42)]),
        code("int-to-roman", "int_to_roman(n)", "convert an integer from 1 to 3999 to a Roman numeral.",
             [([3], "III"), ([1994], "MCMXCIV"), ([3999], "MMMCMXCIX")]),
        code("merge-intervals", "merge_intervals(xs)", "merge overlapping [start, end] intervals and return them as a sorted list of [start, end] lists.",
             [([[[1, 3], [2, 6], [8, 10], [15, 18]]], [[1, 6], [8, 10], [15, 18]]), ([[[1, 4], [4, 5]]], [[1, 5]]), ([[]], [])],
             difficulty="medium"),
        code("binary-search", "binary_search(xs, x)", "return the index of `x` in the sorted list `xs`, or -1 if absent.",
             [([[1, 3, 5, 7, 9], 7], 3), ([[1, 3, 5], 4], -1), ([[], 1], -1)]),
        code("run-length", "rle(s)", "run-length encode a string: `aaabcc` -> `a3b1c2`.",
             [(["aaabcc"], "a3b1c2"), ([""], ""), (["z"], "z1")]),
        code("anagram", "is_anagram(a, b)", "return True if the two strings are anagrams, ignoring case and spaces.",
             [(["Listen", "Silent"], True), (["dormitory", "dirty room"], True), (["abc", "abd"], False)]),
        code("gcd", "gcd(a, b)", "return the greatest common divisor of two non-negative integers (gcd(0, 0) = 0).",
             [([12, 18], 6), ([7, 0], 7), ([0, 0], 0)]),
        code("transpose", "transpose(m)", "return the transpose of a matrix given as a list of equal-length lists.",
             [([[[1, 2, 3], [4, 5, 6]]], [[1, 4], [2, 5], [3, 6]]), ([[]], [])]),
        code("moving-average", "moving_average(xs, k)", "return the list of means of each window of k consecutive numbers.",
             [([[1, 2, 3, 4, 5], 2], [1.5, 2.5, 3.5, 4.5]), ([[4, 8], 3], [])]),
        code("parse-duration", "parse_duration(s)", "turn a duration like `1h30m`, `45s` or `2h5s` (units h, m, s) into seconds.",
             [(["1h30m"], 5400), (["45s"], 45), (["2h5s"], 7205)], difficulty="medium"),
        code("fahrenheit", "c_to_f(c)", "convert degrees Celsius to Fahrenheit.",
             [([0], 32.0), ([100], 212.0), ([-40], -40.0)]),
        code("count-vowels", "count_vowels(s)", "return how many vowels (a, e, i, o, u; any case) are in `s`.",
             [(["Harness"], 2), (["xyz"], 0), (["AEIOU"], 5)]),
        code("second-largest", "second_largest(xs)", "return the second largest distinct value, or None if there is none.",
             [([[3, 1, 4, 4]], 3), ([[5, 5]], None), ([[2, 9]], 2)]),
        code("chunk", "chunk(xs, n)", "split a list into consecutive chunks of length n (the last may be shorter).",
             [([[1, 2, 3, 4, 5], 2], [[1, 2], [3, 4], [5]]), ([[], 3], [])]),
        code("caesar", "caesar(s, k)", "shift each ASCII letter k places along the alphabet (wrapping, keeping case); leave other characters.",
             [(["abc", 1], "bcd"), (["Xyz!", 3], "Abc!"), (["hello", 26], "hello")]),
        code("matrix-multiply", "matmul(a, b)", "multiply two matrices given as lists of lists.",
             [([[[1, 2], [3, 4]], [[5, 6], [7, 8]]], [[19, 22], [43, 50]])], difficulty="medium"),
    ]


# Reference solutions (Harbor's solution/solve.sh, run by its "oracle" agent): Python run in the workspace. They
# compute from the task's data, so a test can show every task is solvable and its grader accepts the answer.
_CSV = "import csv\nrows = list(csv.DictReader(open('{f}')))\n"
_SALES = _CSV.format(f="sales.csv")
_PEOPLE = _CSV.format(f="people.csv")
_OUT = "open('answer.txt', 'w').write(str(ans) + '\\n')\n"
SOLUTIONS: dict[str, str] = {
    "sales-total": _SALES + "ans = sum(int(r['amount']) for r in rows)\n" + _OUT,
    "sales-mean": _SALES + "ans = round(sum(int(r['amount']) for r in rows) / len(rows), 2)\n" + _OUT,
    "sales-top-region": _SALES + "from collections import Counter\nc = Counter()\n"
    "for r in rows: c[r['region']] += int(r['amount'])\nans = c.most_common(1)[0][0]\n" + _OUT,
    "sales-large-orders": _SALES + "ans = sum(int(r['amount']) > 100 for r in rows)\n" + _OUT,
    "sales-distinct-customers": _SALES + "ans = len({r['customer'] for r in rows})\n" + _OUT,
    "sales-best-month": _SALES + "from collections import Counter\nc = Counter()\n"
    "for r in rows: c[r['date'][:7]] += int(r['amount'])\nans = c.most_common(1)[0][0]\n" + _OUT,
    "people-median-age": _PEOPLE + "import statistics\nans = statistics.median(int(r['age']) for r in rows)\n" + _OUT,
    "people-oldest": _PEOPLE + "ans = max(rows, key=lambda r: int(r['age']))['name']\n" + _OUT,
    "inventory-value": "import json\nitems = json.load(open('inventory.json'))\n"
    "ans = round(sum(i['qty'] * i['price'] for i in items), 2)\n" + _OUT,
    "inventory-sale-tag": "import json\nans = sum('sale' in i['tags'] for i in json.load(open('inventory.json')))\n" + _OUT,
    "log-error-count": "ans = sum(line.split()[1] == 'ERROR' for line in open('app.log'))\n" + _OUT,
    "log-top-ip": "from collections import Counter\nans = Counter(l.split()[0] for l in open('access.log')).most_common(1)[0][0]\n" + _OUT,
    "text-word-count": "ans = len(open('text.txt').read().split())\n" + _OUT,
    "text-common-word": "from collections import Counter\nans = Counter(open('text.txt').read().split()).most_common(1)[0][0]\n" + _OUT,
    "temps-stddev": _CSV.format(f="temps.csv") + "import statistics\n"
    "ans = round(statistics.pstdev(float(r['temp']) for r in rows), 2)\n" + _OUT,
    "xy-correlation": _CSV.format(f="xy.csv") + "import statistics\n"
    "ans = round(statistics.correlation([float(r['x']) for r in rows], [float(r['y']) for r in rows]), 3)\n" + _OUT,
    "missing-cells": "import csv\nrows = list(csv.reader(open('data.csv')))[1:]\n"
    "ans = sum(c == '' for r in rows for c in r)\n" + _OUT,
    "email-domains": "ans = len({l.strip().split('@')[1] for l in open('emails.txt') if l.strip()})\n" + _OUT,
    "pass-rate": _CSV.format(f="scores.csv") + "ans = round(100 * sum(int(r['score']) >= 60 for r in rows) / len(rows), 1)\n" + _OUT,
    "weighted-mean": _CSV.format(f="weighted.csv") + "w = [int(r['weight']) for r in rows]\n"
    "ans = round(sum(int(r['score']) * x for r, x in zip(rows, w)) / sum(w), 2)\n" + _OUT,
    "count-functions": "import ast\ntree = ast.parse(open('module.py').read())\n"
    "ans = sum(isinstance(n, ast.FunctionDef) for n in tree.body)\n" + _OUT,
    "nested-sum": "import json\n"
    "def s(v):\n"
    "    if isinstance(v, (bool, str)): return 0\n"
    "    if isinstance(v, (int, float)): return v\n"
    "    return sum(s(x) for x in (v.values() if isinstance(v, dict) else v))\n"
    "ans = s(json.load(open('nested.json')))\n" + _OUT,
    "filter-north": "import csv\nrows = list(csv.reader(open('sales.csv')))\n"
    "csv.writer(open('north.csv', 'w', newline='')).writerows([rows[0]] + [r for r in rows[1:] if r[2] == 'north'])\n",
    "sort-by-amount": "import csv\nrows = list(csv.reader(open('sales.csv')))\n"
    "body = sorted(rows[1:], key=lambda r: (-int(r[4]), r[0]))\n"
    "csv.writer(open('sorted.csv', 'w', newline='')).writerows([rows[0]] + body)\n",
    "region-totals": _SALES + "import json\nt = {}\n"
    "for r in rows: t[r['region']] = t.get(r['region'], 0) + int(r['amount'])\njson.dump(t, open('totals.json', 'w'))\n",
    "csv-to-json": _PEOPLE + "import json\n"
    "json.dump([{'name': r['name'], 'age': int(r['age']), 'city': r['city']} for r in rows], open('people.json', 'w'))\n",
    "dedupe-lines": "lines = open('lines.txt').read().splitlines()\n"
    "open('unique.txt', 'w').write('\\n'.join(dict.fromkeys(lines)) + '\\n')\n",
}
_CODE: dict[str, str] = {
    "fizzbuzz": "def fizzbuzz(n):\n    return ['FizzBuzz' if i % 15 == 0 else 'Fizz' if i % 3 == 0 else 'Buzz' if i % 5 == 0 else str(i)"
    " for i in range(1, n + 1)]\n",
    "palindrome": "def is_palindrome(s):\n    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]\n",
    "fibonacci": "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "primes": "def primes_up_to(n):\n    return [p for p in range(2, n + 1) if all(p % d for d in range(2, int(p ** 0.5) + 1))]\n",
    "word-freq": "def word_freq(text):\n    out = {}\n    for w in text.lower().split():\n        out[w] = out.get(w, 0) + 1\n    return out\n",
    "flatten": "def flatten(xs):\n    out = []\n    for x in xs:\n        out += flatten(x) if isinstance(x, list) else [x]\n    return out\n",
    "roman-to-int": "def roman_to_int(s):\n    v = dict(I=1, V=5, X=10, L=50, C=100, D=500, M=1000)\n"
    "    return sum(-v[a] if v[a] < v[b] else v[a] for a, b in zip(s, s[1:] + 'I')) if s else 0\n",
    "int-to-roman": "def int_to_roman(n):\n"
    "    table = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'), (50, 'L'), (40, 'XL'),"
    " (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')]\n    out = ''\n    for v, r in table:\n"
    "        while n >= v:\n            out, n = out + r, n - v\n    return out\n",
    "merge-intervals": "def merge_intervals(xs):\n    out = []\n    for a, b in sorted(xs):\n"
    "        if out and a <= out[-1][1]:\n            out[-1][1] = max(out[-1][1], b)\n        else:\n            out.append([a, b])\n"
    "    return out\n",
    "binary-search": "import bisect\ndef binary_search(xs, x):\n    i = bisect.bisect_left(xs, x)\n"
    "    return i if i < len(xs) and xs[i] == x else -1\n",
    "run-length": "import itertools\ndef rle(s):\n    return ''.join(f'{c}{len(list(g))}' for c, g in itertools.groupby(s))\n",
    "anagram": "def is_anagram(a, b):\n    f = lambda s: sorted(s.replace(' ', '').lower())\n    return f(a) == f(b)\n",
    "gcd": "import math\ndef gcd(a, b):\n    return math.gcd(a, b)\n",
    "transpose": "def transpose(m):\n    return [list(r) for r in zip(*m)]\n",
    "moving-average": "def moving_average(xs, k):\n    return [sum(xs[i:i + k]) / k for i in range(len(xs) - k + 1)]\n",
    "parse-duration": "import re\ndef parse_duration(s):\n    unit = dict(h=3600, m=60, s=1)\n"
    "    return sum(int(n) * unit[u] for n, u in re.findall(r'(\\d+)([hms])', s))\n",
    "fahrenheit": "def c_to_f(c):\n    return c * 9 / 5 + 32\n",
    "count-vowels": "def count_vowels(s):\n    return sum(c in 'aeiou' for c in s.lower())\n",
    "second-largest": "def second_largest(xs):\n    d = sorted(set(xs))\n    return d[-2] if len(d) > 1 else None\n",
    "chunk": "def chunk(xs, n):\n    return [xs[i:i + n] for i in range(0, len(xs), n)]\n",
    "caesar": "def caesar(s, k):\n    out = ''\n    for c in s:\n        if c.isascii() and c.isalpha():\n"
    "            base = ord('A') if c.isupper() else ord('a')\n            c = chr(base + (ord(c) - base + k) % 26)\n"
    "        out += c\n    return out\n",
    "matrix-multiply": "def matmul(a, b):\n    return [[sum(x * y for x, y in zip(r, c)) for c in zip(*b)] for r in a]\n",
}
SOLUTIONS.update({name: f"open('solution.py', 'w').write({src!r})\n" for name, src in _CODE.items()})


def all_specs() -> list[Spec]:
    specs = data_specs() + code_specs()
    names = [s.name for s in specs]
    assert len(names) == len(set(names)), "task names must be unique"
    assert set(names) == set(SOLUTIONS), "every task needs a reference solution"
    return specs


def split_of(index: int) -> str:
    # Every fifth task is held out for evaluation.
    return "test" if index % 5 == 4 else "train"


def task_toml(spec: Spec, split: str) -> str:
    return (
        'version = "1.0"\n\n'
        "[metadata]\n"
        'author_name = "harnessrl"\n'
        f'difficulty = "{spec.difficulty}"\n'
        f'category = "{spec.category}"\n'
        f'split = "{split}"\n\n'
        "[agent]\ntimeout_sec = 300.0\n\n"
        "[verifier]\ntimeout_sec = 60.0\n\n"
        "[environment]\ncpus = 1\nmemory_mb = 1024\nallow_internet = false\n"
    )


def render(spec: Spec, split: str) -> dict[str, str]:
    """Relative path -> content of one task directory."""
    files = {
        "task.toml": task_toml(spec, split),
        "instruction.md": spec.instruction + "\n",
        "tests/test.sh": TEST_SH,
        "tests/check.py": CHECK_PY,
        "tests/expected.json": json.dumps(spec.expected, indent=1, sort_keys=True) + "\n",
        # Harbor requires environment/; keep it present for tasks without data files.
        "environment/.keep": "",
        "solution/solve.sh": SOLVE_SH.format(code=SOLUTIONS[spec.name]),
    }
    files.update({f"environment/{name}": body for name, body in spec.files.items()})
    return files


def tree() -> dict[str, str]:
    """Path relative to examples/tasks/ -> content, for the whole set."""
    out: dict[str, str] = {}
    for i, spec in enumerate(all_specs()):
        split = split_of(i)
        out.update({f"{split}/{spec.name}/{rel}": body for rel, body in render(spec, split).items()})
    return out


def main() -> int:
    for split in ("train", "test"):
        shutil.rmtree(ROOT / split, ignore_errors=True)
    for rel, body in tree().items():
        path = ROOT / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
        if path.suffix == ".sh":
            path.chmod(0o755)
    print(f"wrote {len(all_specs())} tasks under {ROOT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
