"""Nothing silently ignored: every row of daemon/sampling.def, at every door it names, sent to a
real build/rolloutd (the default model) with a value that is not the default.

Each row has a case here (a row without one fails the test, as does a case without a row): the
value to send and what must follow. Implemented fields must change the answer the way their
definition says (the tokens differ from the same request without the field, the count of samples
or tokens moves, a stop string stays in the text, ...); refused fields must get 400 naming the
field; the few the table marks as having no effect here (as in the engine the door imitates) must
give the same answer as without them. The prompt is a chat turn the model answers briefly, so EOS,
stop strings and control tokens all occur. The daemon ends with SIGTERM and must exit 0."""
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import MODEL, ROOT, case, main  # noqa: E402

from rdtest import Daemon, stop_cleanly  # noqa: E402

DOORS = {"SD_SGL": 1, "SD_SGLT": 2, "SD_VSP": 4, "SD_CMPL": 8, "SD_CHAT": 16}
MESSAGES = [{"role": "user", "content": "Name one colour. Answer with one word."}]
_d = []


def daemon():
    if not _d:
        _d.append(Daemon(model=MODEL))
    return _d[0]


def post(path, obj, timeout=120):
    return daemon().post(path, obj, timeout)


def table_rows():
    """(sglang name, vllm name, doors bitmask, kind) of each SF row of sampling.def."""
    rows = []
    with open(os.path.join(ROOT, "daemon/sampling.def")) as f:
        for line in f:
            if not line.startswith("SF("):
                continue
            m = re.match(r'SF\(\s*(NULL|"[^"]*")\s*,\s*(NULL|"[^"]*")\s*,\s*([A-Z_| ]+),\s*(SK_[A-Z_]+)\s*,', line)
            assert m, f"sampling.def row not in the expected shape: {line!r}"
            name = [None if g == "NULL" else g.strip('"') for g in m.group(1, 2)]
            doors = sum(DOORS[d.strip()] for d in m.group(3).split("|"))
            rows.append((name[0], name[1], doors, m.group(4)))
    return rows


_ids = []


def prompt_ids():
    if not _ids:
        st, doc = post("/tokenize", {"messages": MESSAGES})
        assert st == 200, doc
        _ids.extend(doc["tokens"])
    return list(_ids)


def ask(door, name, value, base):
    """(status, answers) of one call at door: base sampling fields plus name = value (name None:
    none). answers: one (token ids, text or None, finish) per sample; on an error the error doc."""
    sp = dict(base)
    if name is not None:
        sp[name] = value
    mt = sp.pop("max_tokens", 16)
    if door == "SD_SGL" or door == "SD_SGLT":
        top = {}
        if door == "SD_SGLT" and name is not None:
            top[name] = sp.pop(name)
        st, doc = post("/generate", {"input_ids": prompt_ids(), "sampling_params": {"max_new_tokens": mt, **sp},
                                     **top})
        if st != 200:
            return st, doc
        docs = doc if isinstance(doc, list) else [doc]
        return st, [(d["output_ids"], d["text"], d["meta_info"]["finish_reason"]["type"]) for d in docs]
    if door == "SD_VSP":
        st, doc = post("/inference/v1/generate", {"token_ids": prompt_ids(),
                                                  "sampling_params": {"max_tokens": mt, **sp}})
        if st != 200:
            return st, doc
        return st, [(c["token_ids"], None, c["finish_reason"], c.get("logprobs")) for c in doc["choices"]]
    if door == "SD_CMPL":
        st, doc = post("/v1/completions", {"prompt": prompt_ids(), "max_tokens": mt, "return_token_ids": True, **sp})
    else:
        st, doc = post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": mt, "return_token_ids": True,
                                                **sp})
    if st != 200:
        return st, doc
    out = []
    for c in doc["choices"]:
        text = c["text"] if door == "SD_CMPL" else c["message"]["content"]
        out.append((c["token_ids"], text, c["finish_reason"]))
    return st, out


GREEDY = {"temperature": 0}
SAMPLED = {"temperature": 1.0, "SEED": 3}


def seeded(door, base):
    """base with its seed under the door's name."""
    b = dict(base)
    if "SEED" in b:
        b["sampling_seed" if door in ("SD_SGL",) else "seed"] = b.pop("SEED")
    return b


def differs(value, base=GREEDY):
    """The tokens change."""
    def check(door, name):
        b = seeded(door, base)
        st0, a0 = ask(door, None, None, b)
        st, a = ask(door, name, value, b)
        assert st0 == 200 and st == 200, (st0, st, a)
        assert [x[0] for x in a] != [x[0] for x in a0], ("no effect", a, a0)
    return check


def same(value, base=GREEDY):
    """Accepted, and the answer is the same as without it (a field without effect here, as in the engine
    the door imitates)."""
    def check(door, name):
        b = seeded(door, base)
        st0, a0 = ask(door, None, None, b)
        st, a = ask(door, name, value, b)
        assert st0 == 200 and st == 200, (st0, st, a)
        assert [x[:3] for x in a] == [x[:3] for x in a0], (a, a0)
    return check


def refused(value):
    def check(door, name):
        st, doc = ask(door, name, value, GREEDY)
        msg = json.dumps(doc)
        assert st == 400 and name in msg, ("accepted", st, doc)
    return check


def text_only(check_text, value, base):
    """A field that acts on the text: at /inference/v1/generate (token ids, no text) it changes nothing,
    as in vLLM; elsewhere check_text(text with it, text without it) holds."""
    def check(door, name):
        if door == "SD_VSP":
            return same(value, base)(door, name)
        b = seeded(door, base)
        st0, a0 = ask(door, None, None, b)
        st, a = ask(door, name, value, b)
        assert st0 == 200 and st == 200, (st0, st, a)
        assert [x[0] for x in a] == [x[0] for x in a0], (a, a0)
        assert check_text(a[0][1], a0[0][1]), (a[0][1], a0[0][1])
    return check


def n_samples(door, name):
    st, a = ask(door, name, 3, SAMPLED if door != "SD_SGL" else {"temperature": 1.0})
    assert st == 200 and len(a) == 3, (st, a)


def max_len(door, name):
    st, a = ask(door, name, 3, {"temperature": 0, "ignore_eos": True})
    assert st == 200 and len(a[0][0]) == 3 and a[0][2] == "length", (st, a)


def first_tokens():
    st, a = ask("SD_SGL", None, None, {"temperature": 0, "ignore_eos": True})
    return a[0][0]


def stop_token(door, name):
    toks = first_tokens()
    st, a = ask(door, name, [toks[1]], {"temperature": 0, "ignore_eos": True})
    assert st == 200 and a[0][0] == toks[:2] and a[0][2] == "stop", (st, a, toks)


def stop_string(door, name):
    st, base = ask("SD_CMPL", None, None, {"temperature": 0, "ignore_eos": True})
    text = base[0][1]
    cut = text[len(text) // 3: len(text) // 3 + 3]
    st, a = ask(door, name, [cut], {"temperature": 0, "ignore_eos": True})
    assert st == 200 and a[0][2] == "stop" and len(a[0][0]) < len(base[0][0]), (st, a, cut)
    if a[0][1] is not None:
        assert cut not in a[0][1], (a, cut)


def min_tokens(door, name):
    toks = first_tokens()
    st, a = ask(door, name, 6, {"temperature": 0, "stop_token_ids": [toks[1]]})
    assert st == 200 and len(a[0][0]) >= 6 and toks[1] not in a[0][0][:6], (st, a)


def ignore_eos(door, name):
    st0, a0 = ask(door, None, None, {"temperature": 0, "max_tokens": 48})
    assert a0[0][2] == "stop" and len(a0[0][0]) < 48, a0   # the model ends its turn
    st, a = ask(door, name, True, {"temperature": 0, "max_tokens": 48})
    assert st == 200 and len(a[0][0]) == 48 and a[0][2] == "length", (st, a)


def keep_stop(door, name):
    base = {"temperature": 0, "ignore_eos": True, "stop": None}
    st, b = ask("SD_CMPL", None, None, {"temperature": 0, "ignore_eos": True})
    text = b[0][1]
    cut = text[len(text) // 3: len(text) // 3 + 3]
    base["stop"] = [cut]
    if door in ("SD_SGL", "SD_SGLT"):
        # SGLang's no_stop_trim keeps all of the token that completed the string.
        text_only(lambda t, t0: cut in t and cut not in t0 and len(t) > len(t0), True, base)(door, name)
    else:
        # vLLM's include_stop_str_in_output: the text ends with the string.
        text_only(lambda t, t0: t.endswith(cut) and cut not in t0, True, base)(door, name)


def skip_special(door, name):
    # With ignore_eos the turn's end token is generated and kept going past; its text is skipped by
    # default (as in vLLM and SGLang) and shows with skip_special_tokens false.
    base = {"temperature": 0, "ignore_eos": True, "max_tokens": 48}
    text_only(lambda t, t0: "<|im_end|>" in t and "<|im_end|>" not in t0, False, base)(door, name)


def route_logprobs(door, name):
    st, a = ask(door, name, 2, GREEDY)
    assert st == 200 and a[0][3] and len(a[0][3]["content"][0]["top_logprobs"]) == 2, (st, a)


def prompt_scored(door, name):
    ids = prompt_ids()
    st, doc = post("/generate", {"input_ids": ids, "return_logprob": True, name: 2,
                                 "sampling_params": {"max_new_tokens": 0}})
    assert st == 200 and len(doc["meta_info"]["input_token_logprobs"]) == len(ids) - 2, (st, doc)
    st, doc = post("/generate", {"input_ids": ids, "return_logprob": True, "sampling_params": {"max_new_tokens": 2}})
    assert st == 200 and "input_token_logprobs" not in doc["meta_info"], doc


def prompt_logprobs_case(door, name):
    """vLLM's layout at each door: one entry per prompt token, None first, then a dict keyed by token id with
    the prompt token's entry and the asked alternatives (ranks 1, 2)."""
    ids = prompt_ids()
    if door == "SD_VSP":
        st, doc = post("/inference/v1/generate", {"token_ids": ids, "sampling_params": {"max_tokens": 0, name: 2}})
        lps, toks = (doc.get("prompt_logprobs"), ids) if st == 200 else (None, ids)
    elif door == "SD_CMPL":
        st, doc = post("/v1/completions", {"prompt": ids, "max_tokens": 0, name: 2})
        lps, toks = (doc["choices"][0].get("prompt_logprobs"), ids) if st == 200 else (None, ids)
    else:
        st, doc = post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1, name: 2,
                                                "return_token_ids": True})
        lps = doc.get("prompt_logprobs") if st == 200 else None
        toks = doc.get("prompt_token_ids") if st == 200 else None
    assert st == 200 and lps and toks and len(lps) == len(toks) and lps[0] is None, (st, doc)
    for t, d in zip(toks[1:], lps[1:]):
        assert str(t) in d and 2 <= len(d) <= 3, d
        ranks = sorted(v["rank"] for k, v in d.items() if k != str(t) or d[k]["rank"] <= 2)
        assert ranks[:2] == [1, 2] and d[str(t)]["logprob"] <= 0, d
    st, doc = post("/v1/completions", {"prompt": ids, "max_tokens": 1, name: -1})
    assert st == 400 and name in json.dumps(doc), (st, doc)


def want_ids_case(door, name):
    ids = prompt_ids()
    st, doc = post("/generate", {"input_ids": ids, "return_logprob": True, name: [5, 17],
                                 "sampling_params": {"max_new_tokens": 3, "ignore_eos": True, "temperature": 0}})
    assert st == 200, doc
    got = doc["meta_info"]["output_token_ids_logprobs"]
    assert len(got) == 3 and all([t[1] for t in g] == [5, 17] and all(t[0] < 0 for t in g) for g in got), got


def lora_not_loaded(door, name):
    """A name no /load_lora_adapter registered is refused, naming it (test_lora_routes.py serves real ones)."""
    st, doc = post("/generate", {"input_ids": prompt_ids(), name: "adapter-a", "sampling_params": {"max_new_tokens": 2}})
    assert st == 400 and "adapter-a" in json.dumps(doc) and "not loaded" in json.dumps(doc), (st, doc)


CASES = {
    "temperature": differs(1.5, {"temperature": 0, "SEED": 7}),
    "top_p": differs(0.05, SAMPLED),
    "top_k": differs(1, SAMPLED),
    "min_p": differs(0.6, SAMPLED),
    "repetition_penalty": differs(1.8),
    "frequency_penalty": differs(1.5),
    "presence_penalty": differs(2.0),
    "logit_bias": differs({"17": 100}),
    "min_new_tokens": min_tokens,
    "sampling_seed": differs(12345, SAMPLED),
    "seed": differs(12345, {"temperature": 1.0, "sampling_seed": 3}),
    "n": n_samples,
    "max_new_tokens": max_len,
    "max_completion_tokens": max_len,
    "stop": stop_string,
    "stop_token_ids": stop_token,
    "ignore_eos": ignore_eos,
    "no_stop_trim": keep_stop,
    "skip_special_tokens": skip_special,
    "spaces_between_special_tokens": same(False, {"temperature": 0, "ignore_eos": True, "max_tokens": 40}),
    "logprobs": route_logprobs,
    "detokenize": same(False),
    # The default model is dense, so no routes are returned: the start changes nothing (test_frameworks_scrape.py
    # checks it on a mixture of experts).
    "routed_experts_prompt_start": same(2),
    "prompt_logprobs": prompt_logprobs_case,
    "token_ids_logprob": want_ids_case,
    "stop_regex": refused("[0-9]"),
    "json_schema": refused('{"type": "object"}'),
    "regex": refused("[a-z]+"),
    "ebnf": refused('root ::= "a"'),
    "structural_tag": refused('{"type": "structural_tag"}'),
    "structured_outputs": refused({"json": {"type": "object"}}),
    "guided_decoding": refused({"regex": "a+"}),
    "guided_json": refused({"type": "object"}),
    "guided_regex": refused("a+"),
    "guided_choice": refused(["red", "blue"]),
    "guided_grammar": refused('root ::= "a"'),
    "response_format": refused({"type": "json_object"}),
    "tools": refused([{"type": "function", "function": {"name": "f", "parameters": {}}}]),
    "tool_choice": refused("required"),
    "allowed_token_ids": refused([1, 2, 3]),
    "bad_words": refused(["blue"]),
    "logits_processors": refused(["mod.Proc"]),
    "custom_params": refused({"k": 1}),
    "extra_args": refused({"k": 1}),
    "truncate_prompt_tokens": refused(4),
    "best_of": refused(2),
    "use_beam_search": refused(True),
    "length_penalty": refused(0.5),
    "suffix": refused("end"),
    "return_tokens_as_token_ids": refused(True),
    "stream_interval": refused(4),
    "logprob_start_len": prompt_scored,
    "lora_path": lora_not_loaded,
    "user": same("user-1"),
    "cache_salt": same("tenant-7"),
}


@case
def every_row_has_a_case_and_every_case_a_row():
    keys = {r[0] or r[1] for r in table_rows()}
    assert len(keys) == len(table_rows()), "two rows share a key"
    missing = sorted(keys - set(CASES))
    stale = sorted(set(CASES) - keys)
    assert not missing, f"sampling.def rows without a case in test_sampling_table.py: {missing}"
    assert not stale, f"cases for fields sampling.def no longer lists: {stale}"


@case
def every_field_at_every_door_takes_effect_or_is_refused():
    failures, checked = [], 0
    for sgl, vllm, doors, kind in table_rows():
        key = sgl or vllm
        for door, bit in DOORS.items():
            if not doors & bit:
                continue
            name = sgl if door in ("SD_SGL", "SD_SGLT") else vllm
            try:
                CASES[key](door, name)
                checked += 1
            except Exception as e:  # collected: one run names every field that fails
                failures.append(f"{name} at {door} ({kind}): {e!r}"[:600])
    assert not failures, "\n".join(failures)
    assert checked >= 100, checked


@case
def unknown_fields_follow_the_door():
    # SGLang's sampling_params refuses a name it does not know; vLLM's routes ignore extra fields.
    st, doc = post("/generate", {"input_ids": prompt_ids(), "sampling_params": {"max_new_tokens": 2, "colour": 1}})
    assert st == 400 and "colour" in doc["detail"], (st, doc)
    st, doc = post("/v1/completions", {"prompt": prompt_ids(), "max_tokens": 2, "colour": 1})
    assert st == 200, (st, doc)
    st, doc = post("/inference/v1/generate", {"token_ids": prompt_ids(),
                                              "sampling_params": {"max_tokens": 2, "colour": 1}})
    assert st == 200, (st, doc)


@case
def daemon_exits_cleanly():
    stop_cleanly(*_d)


if __name__ == "__main__":
    main()
