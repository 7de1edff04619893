#!/usr/bin/env python3
"""Stop strings through the engine (engine/text/stopstr.h), on the default model.

A greedy run without stop strings gives the reference tokens; llama.cpp's
detokenizer (llama-cpp-python, vocab only) turns them into text. For stop
strings cut out of that text (spanning token boundaries, inside the first
token, two at once, one that never occurs), the run with them
(build/rollout-gen --stop) must:
- keep exactly the reference tokens up to and including the first token
  whose prefix text contains a stop string (greedy: the same tokens), and
  finish "stop" there with that string (of several, the one that starts
  first);
- cut its text where the string starts (Python's str.find on llama.cpp's
  text), with stop_text_offset the byte offset;
- run to max_tokens, finish "length", when no string occurs.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, MODEL, case, main, run  # noqa: E402

GEN = os.path.join(BUILD, "rollout-gen")
PROMPT = "Write a short story about a robot who learns to paint. Once upon a time,"
N = 40

_ref = {}


def gen(*stops, max_tokens=N):
    args = [GEN, "--model", MODEL, "--prompt", PROMPT, "--temperature", "0", "--max-tokens", str(max_tokens),
            "--ignore-eos", "--json", "--threads", "2"]
    for s in stops:
        args += ["--stop", s]
    return json.loads(run(args).stdout)


def detok(ids):
    if "llm" not in _ref:
        import llama_cpp
        _ref["llm"] = llama_cpp.Llama(model_path=MODEL, vocab_only=True, verbose=False)
    return _ref["llm"].detokenize(ids)


def reference():
    if "r" not in _ref:
        r = gen()
        assert r["finish_reason"] == "length" and len(r["token_ids"]) == N, r["finish_reason"]
        _ref["r"] = r
    return _ref["r"]["token_ids"]


def expect(ids, stops):
    """(tokens kept, stop string, byte offset) from llama.cpp's text alone."""
    for t in range(1, len(ids) + 1):
        text = detok(ids[:t])
        hits = [(text.find(s.encode()), -len(s), s) for s in stops if text.find(s.encode()) >= 0]
        if hits:
            at, _, s = min(hits)
            return t, s, at
    return None


def check(stops):
    ids = reference()
    want = expect(ids, stops)
    got = gen(*stops)
    if want is None:
        assert got["finish_reason"] == "length" and got["token_ids"] == ids, \
            f"{stops}: no string occurs, yet finish {got['finish_reason']} after {len(got['token_ids'])} tokens"
        return
    t, s, at = want
    assert got["finish_reason"] == "stop", f"{stops}: finish {got['finish_reason']}, expected stop at token {t}"
    assert got["token_ids"] == ids[:t], f"{stops}: kept {len(got['token_ids'])} tokens, expected the first {t}"
    assert got["stop_str"] == s and got["stop_text_offset"] == at, \
        f"{stops}: matched {got.get('stop_str')!r} at {got.get('stop_text_offset')}, expected {s!r} at {at}"
    assert got["text"].encode() == detok(ids)[:at], f"{stops}: text {got['text']!r} not cut at {at}"


@case
def test_spanning_token_boundaries():
    ids = reference()
    text = detok(ids).decode("utf-8", "replace")
    # pieces across each boundary between tokens 5..12: the last 3 characters of one token's prefix
    # and the first 3 of the rest
    spans = 0
    for t in range(5, 13):
        cut = len(detok(ids[:t]).decode("utf-8", "replace"))
        s = text[max(0, cut - 3):cut + 3]
        if len(s) >= 2 and s.strip():
            check([s])
            spans += 1
    assert spans >= 4, f"only {spans} boundary strings could be cut from {text!r}"


@case
def test_first_token_and_several():
    ids = reference()
    first = detok(ids[:1]).decode("utf-8", "replace")
    assert first.strip(), f"the first token {first!r} is blank"
    check([first.strip()[:2]])                 # inside the very first token
    later = detok(ids).decode("utf-8", "replace")[30:36]
    check([later, first.strip()[:2]])          # two: the earlier one wins
    check(["\u2603 never here \u2603", later])  # one absent, one present


@case
def test_absent_runs_to_length():
    check(["\u2603 never here \u2603"])


if __name__ == "__main__":
    main()
