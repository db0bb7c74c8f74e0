"""Checks the workspace against expected.json. Exit 0 = correct, 1 = wrong."""

import csv
import importlib.util
import json
import math
import sys
from pathlib import Path


def wrong(msg):
    print("WRONG:", msg)
    sys.exit(1)


def read(name):
    path = Path(name)
    if not path.is_file():
        wrong(f"{name} was not written")
    return path.read_text()


def same(a, b, tol):
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, abs_tol=tol)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y, tol) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], tol) for k in a)
    return a == b


def main():
    exp = json.loads(Path(sys.argv[1]).read_text())
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
        if not Path("solution.py").is_file():
            wrong("solution.py was not written")
        spec = importlib.util.spec_from_file_location("solution", "solution.py")
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
            fn = getattr(module, exp["function"])
        except Exception as e:
            wrong(f"solution.py does not load or lacks {exp['function']}: {e!r}")
        for args, want in exp["cases"]:
            try:
                got = fn(*args)
            except Exception as e:
                wrong(f"{exp['function']}{tuple(args)} raised {e!r}")
            if isinstance(got, tuple):
                got = list(got)
            if not same(got, want, tol):
                wrong(f"{exp['function']}{tuple(args)} = {got!r}, expected {want!r}")
    else:
        print("unknown check kind", kind)
        sys.exit(2)
    print("CORRECT")


main()
