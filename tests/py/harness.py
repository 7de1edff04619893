"""Shared helpers for the Python tests: PASS/FAIL lines counted by tests/run.sh.

A test file defines functions decorated with @case and ends with main(); a case
fails when it raises (assert or otherwise)."""
import os
import subprocess
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("RD_BUILD", "build"))
MODEL = os.path.join(ROOT, os.environ.get("RD_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
TMP = os.environ.get("RD_TMP") or "/tmp"
# tools/llamacpp_info.py: the oracles load llama.cpp through it (it prints the build and buffer types).
sys.path.insert(0, os.path.join(ROOT, "tools"))

_cases = []


def case(fn):
    _cases.append(fn)
    return fn


def run(args, **kw):
    """Runs a command, returning CompletedProcess (text mode); raises with its
    stderr when it fails unless check=False is passed."""
    check = kw.pop("check", True)
    p = subprocess.run(args, capture_output=True, text=True, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} exited {p.returncode}: {p.stderr.strip()[-2000:]}")
    return p


class Skip(Exception):
    """Raised by a case that cannot run here (a missing optional package or model): it prints a
    SKIP line and no PASS, so the suite's count says what ran."""


def main():
    failed = 0
    only = [c for c in os.environ.get("RD_CASES", "").split(",") if c]
    for fn in _cases:
        if only and fn.__name__ not in only:
            continue
        if fn.__module__ != "__main__":
            continue    # a case of a test file this one imports helpers from: that file runs it
        t0 = time.monotonic()
        try:
            fn()
            # The case's time goes after its name (where the suite's time goes; tests/run.sh counts the line).
            print(f"PASS {fn.__name__} ({time.monotonic() - t0:.1f} s)", flush=True)
        except Skip as e:
            print(f"SKIP {fn.__name__}: {e}", flush=True)
        except Exception as e:  # a failing case, not a crash of the runner
            failed += 1
            tb = traceback.format_exc().strip().splitlines()[-3:]
            print(f"FAIL {fn.__name__}: {e!r} | {' / '.join(tb)}"[:2000], flush=True)
    sys.exit(1 if failed else 0)
