"""The generation routes of the HTTP server (issue 13) for real: build/rolloutd
on loopback with an api key, driven by the `openai` package (/v1/completions,
/v1/chat/completions, streaming, n > 1, logprobs, return_token_ids), by a
slime-style urllib loop on /generate, and compared bit for bit with the NNG
path (tools/python/rolloutd): same prompt ids, parameters and seed must give
the same token ids and the same float32 log-probs. Also: stop strings across
token boundaries and at the first token, abort_all returning partial outputs,
pause/continue, 400s naming the field, 503 with the NNG BUSY words, and
clients that leave mid-request or mid-stream (their KV blocks must return).
The daemon ends with SIGTERM and must exit 0 (under ASan: no leaks)."""
import http.client
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import MODEL, ROOT, TMP, case, main  # noqa: E402
from gguf_fast import GGUFReader  # noqa: E402  (the package's reader, its arrays read in one pass)

from rdtest import PROMPT, Daemon, stop_cleanly  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import Client  # noqa: E402

import openai  # noqa: E402

KEY = "api-test-key_0123456789"
D = None
D_KEYFILE = []


def daemon():
    global D
    if D is None:
        kf = os.path.join(TMP, f"rd-api-key-{os.getpid()}")
        with open(kf, "w") as f:
            f.write(KEY + "\n")
        os.chmod(kf, 0o600)
        D_KEYFILE.append(kf)
        D = Daemon("--api-key-file", kf)
    return D


def post(path, body, timeout=180, key=KEY):
    """(status, parsed JSON body) of a POST."""
    d = daemon()
    req = urllib.request.Request(f"http://127.0.0.1:{d.http_port}{path}", data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json",
                                                         **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def get(path):
    d = daemon()
    req = urllib.request.Request(f"http://127.0.0.1:{d.http_port}{path}", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, json.loads(r.read())


# The name the daemon serves the default model under (no served_model_name: the file's base name); /v1
# calls naming another model get 404, as vLLM answers them.
NAME = os.path.basename(MODEL)[:-len(".gguf")]


def oai():
    return openai.OpenAI(base_url=f"http://127.0.0.1:{daemon().http_port}/v1", api_key=KEY, max_retries=0,
                         timeout=60)


def kv_settles():
    """Waits until nothing runs and every KV block is free again."""
    deadline = time.time() + 20
    while True:
        s = get("/status")[1]
        if s["kv_cache"]["blocks_used"] == 0 and s["requests"]["running"] == 0 and s["requests"]["waiting"] == 0:
            return s
        assert time.time() < deadline, f"KV blocks never returned: {s['kv_cache']} {s['requests']}"
        time.sleep(0.1)


# ---- the OpenAI package ----

@case
def text_is_valid_utf8_whatever_the_tokens():
    # At a high temperature samples pick byte-level tokens that cut characters. The JSON must stay UTF-8 and
    # "text" must be the errors="replace" decode of the exact bytes (llama.cpp's detokenizer gives the bytes).
    import random

    import llama_cpp
    rng = random.Random(5)
    ids = [[rng.randrange(100, 40000) for _ in range(16)] for _ in range(8)]
    st, out = post("/generate", {"input_ids": ids, "sampling_params": {
        "max_new_tokens": 48, "temperature": 2.0, "n": 8, "seed": 3, "ignore_eos": True}}, timeout=900)
    assert st == 200, out
    llm = llama_cpp.Llama(model_path=MODEL, vocab_only=True, verbose=False)
    invalid = checked = 0
    for o in out:
        # llama.cpp renders unused/user-defined tokens as nothing where we give their text (tokenizer.h):
        # compare the samples without such tokens
        if any(llm.detokenize([t], special=True) == b"" for t in o["output_ids"]):
            continue
        raw = llm.detokenize(o["output_ids"], special=True)
        want = raw.decode("utf-8", "replace")
        invalid += want != raw.decode("utf-8", "ignore")
        checked += 1
        assert o["text"] == want, f"text {o['text']!r} vs the replace-decode {want!r}"
    assert checked >= 16, f"only {checked} of {len(out)} samples could be compared"
    assert invalid > 0, "no sample cut a character: the case did not test the clean-up"


@case
def openai_completions_n_logprobs_token_ids():
    r = oai().completions.create(model=NAME, prompt="The capital of France is", max_tokens=6, n=3, seed=7,
                                 temperature=0.9, logprobs=2, extra_body={"return_token_ids": True})
    assert len(r.choices) == 3 and sorted(c.index for c in r.choices) == [0, 1, 2], r
    for c in r.choices:
        d = c.model_dump()
        ids = d["token_ids"]
        assert 1 <= len(ids) <= 6 and d["prompt_token_ids"], d
        lp = c.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(ids) == len(lp.top_logprobs), d
        assert all(x <= 0 for x in lp.token_logprobs)
        assert c.finish_reason in ("stop", "length")
        assert all(len(t) >= 1 for t in lp.top_logprobs)
    assert len({tuple(c.model_dump()["token_ids"]) for c in r.choices}) > 1, "seeded n samples must differ"
    assert r.usage.completion_tokens == sum(len(c.model_dump()["token_ids"]) for c in r.choices)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    # The same seed gives the same choices again.
    r2 = oai().completions.create(model=NAME, prompt="The capital of France is", max_tokens=6, n=3, seed=7,
                                  temperature=0.9, extra_body={"return_token_ids": True})
    assert [c.model_dump()["token_ids"] for c in r.choices] == [c.model_dump()["token_ids"] for c in r2.choices]


@case
def openai_completions_token_prompt_and_batch():
    c = oai()
    r = c.completions.create(model=NAME, prompt=PROMPT, max_tokens=4, temperature=0,
                             extra_body={"return_token_ids": True})
    assert r.choices[0].model_dump()["prompt_token_ids"] == PROMPT
    r = c.completions.create(model=NAME, prompt=["Hello", "One two"], max_tokens=3, temperature=0, n=2)
    assert len(r.choices) == 4 and [x.index for x in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text, "greedy samples of one prompt agree"


@case
def openai_completions_stream_with_usage():
    chunks = list(oai().completions.create(model=NAME, prompt="Once upon a time", max_tokens=5, n=2, seed=3,
                                           stream=True, stream_options={"include_usage": True}))
    texts = {}
    for ch in chunks:
        if ch.choices:  # deltas: each choice's text is the concatenation of its chunks
            texts[ch.choices[0].index] = texts.get(ch.choices[0].index, "") + ch.choices[0].text
    assert set(texts) == {0, 1}, chunks
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 2, chunks[-1]
    whole = oai().completions.create(model=NAME, prompt="Once upon a time", max_tokens=5, n=2, seed=3)
    assert [c.text for c in whole.choices] == [texts[0], texts[1]], "stream and whole answer agree"


@case
def openai_chat_stream_and_not():
    c = oai()
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi."}]
    r = c.chat.completions.create(model=NAME, messages=msgs, max_tokens=8, temperature=0, logprobs=True,
                                  top_logprobs=2, extra_body={"return_token_ids": True})
    ch = r.choices[0]
    d = r.model_dump()
    assert ch.message.role == "assistant" and isinstance(ch.message.content, str)
    assert d["prompt_token_ids"] and d["choices"][0]["token_ids"], d
    assert len(ch.logprobs.content) == len(d["choices"][0]["token_ids"])
    assert all(len(t.top_logprobs) == 2 for t in ch.logprobs.content)
    # Greedy: the sampled token is the top alternative.
    assert all(t.top_logprobs[0].logprob == t.logprob for t in ch.logprobs.content)
    stream = list(c.chat.completions.create(model=NAME, messages=msgs, max_tokens=8, temperature=0, stream=True))
    text = "".join(x.choices[0].delta.content or "" for x in stream if x.choices)
    assert text == ch.message.content, (text, ch.message.content)
    assert stream[-1].choices[0].finish_reason in ("stop", "length")
    # What the chat format cannot render is refused by name.
    try:
        c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "a"},
                                                        {"role": "tool", "content": "b"}])
        raise AssertionError("a tool message must be refused")
    except openai.BadRequestError as e:
        assert "messages" in e.body["message"] and "tool" in e.body["message"] and e.status_code == 400, e.body


@case
def openai_streams_token_by_token():
    """Progress streams while the samples run: many content chunks before the last, whose deltas add up to
    the answer without streaming (same seed), token ids and log-probs included; the usage chunk ends it."""
    c = oai()
    kw = dict(model=NAME, max_tokens=32, temperature=0.8, seed=11, extra_body={"return_token_ids": True,
                                                                             "ignore_eos": True})
    for kind in ("completions", "chat"):
        if kind == "chat":
            msgs = [{"role": "system", "content": "You are a storyteller."},
                    {"role": "user", "content": "Tell me a story about a cat."}]
            whole = c.chat.completions.create(messages=msgs, logprobs=True, **kw)
            chunks = list(c.chat.completions.create(messages=msgs, logprobs=True, stream=True,
                                                    stream_options={"include_usage": True}, **kw))
            texts = [x.choices[0].delta.content for x in chunks if x.choices]
            want_text = whole.choices[0].message.content
            lps = [t.logprob for x in chunks if x.choices and x.choices[0].logprobs
                   for t in x.choices[0].logprobs.content]
            want_lps = [t.logprob for t in whole.choices[0].logprobs.content]
        else:
            whole = c.completions.create(prompt="Once upon a time", logprobs=0, **kw)
            chunks = list(c.completions.create(prompt="Once upon a time", logprobs=0, stream=True,
                                               stream_options={"include_usage": True}, **kw))
            texts = [x.choices[0].text for x in chunks if x.choices]
            want_text = whole.choices[0].text
            lps = [v for x in chunks if x.choices and x.choices[0].logprobs
                   for v in x.choices[0].logprobs.token_logprobs]
            want_lps = whole.choices[0].logprobs.token_logprobs
        body = [x for x in chunks if x.choices]
        content = [t for t in texts if t]
        assert len(content) > 4, f"{kind}: only {len(content)} content chunks for 32 tokens: {texts}"
        assert all(x.choices[0].finish_reason is None for x in body[:-1]), kind
        assert body[-1].choices[0].finish_reason == "length", body[-1]
        assert "".join(t or "" for t in texts) == want_text, (kind, texts, want_text)
        ids = [t for x in body for t in (x.choices[0].model_dump().get("token_ids") or [])]
        assert ids == whole.choices[0].model_dump()["token_ids"] and len(ids) == 32, (kind, ids)
        assert lps == want_lps, kind
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 32, chunks[-1]
        print(f"  {kind}: {len(body)} chunks, {len(content)} with content, for 32 tokens", flush=True)
    # The first content chunk comes while the sample still runs (progress, not a finished sample cut up).
    stream = c.completions.create(model=NAME, prompt="Once upon a time", max_tokens=200, temperature=0.8, seed=1,
                                  stream=True, extra_body={"ignore_eos": True})
    for x in stream:
        if x.choices and x.choices[0].text:
            st = get("/status")[1]
            assert st["requests"]["running"] == 1, st["requests"]
            break
    stream.close()  # the client leaves: its request is aborted
    kv_settles()


def _sse(body, path="/generate"):
    """The events of a streamed POST, as parsed JSON (without [DONE])."""
    d = daemon()
    c = http.client.HTTPConnection("127.0.0.1", d.http_port, timeout=60)
    c.request("POST", path, body=json.dumps(body), headers={"Authorization": f"Bearer {KEY}",
                                                            "Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.read()
    out = []
    for line in r:
        line = line.strip()
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            out.append(json.loads(line[6:]))
    c.close()
    return out


@case
def generate_streams_cumulative_and_holds_back_stop_prefixes():
    # SGLang's form: every event carries the text, ids and log-probs so far; the last one the finish reason.
    body = {"input_ids": PROMPT, "return_logprob": True, "stream": True,
            "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}}
    ev = _sse(body)
    st, whole = post("/generate", {**body, "stream": False})
    assert len(ev) > 4, f"only {len(ev)} events for 24 tokens"
    assert all(e["meta_info"]["finish_reason"] is None for e in ev[:-1])
    assert ev[-1]["output_ids"] == whole["output_ids"] and ev[-1]["text"] == whole["text"]
    assert ev[-1]["meta_info"]["output_token_logprobs"] == whole["meta_info"]["output_token_logprobs"]
    for a, b in zip(ev, ev[1:]):
        assert b["text"].startswith(a["text"]) and b["output_ids"][:len(a["output_ids"])] == a["output_ids"]
    # A stop string: no event shows text past the cut, though the tokens that might begin it were sampled.
    full = whole["text"]
    stop = full[len(full) // 2: len(full) // 2 + 6]
    assert len(stop) == 6 and full.count(stop) == 1, full
    cut = full.index(stop)
    ev = _sse({**body, "sampling_params": {**body["sampling_params"], "stop": [stop]}})
    assert ev[-1]["text"] == full[:cut] and ev[-1]["meta_info"]["finish_reason"]["matched"] == stop, ev[-1]
    assert all(full[:cut].startswith(e["text"]) for e in ev), [e["text"] for e in ev]
    # OpenAI deltas with the same stop add up to the cut text.
    chunks = list(oai().completions.create(model=NAME, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop],
                                           stream=True, extra_body={"ignore_eos": True}))
    assert "".join(x.choices[0].text for x in chunks if x.choices) == full[:cut]
    kv_settles()


@case
def flush_cache_drops_the_prefix_cache():
    long_prompt = PROMPT * 8  # 56 tokens: 3 full blocks of 16 cached after it ran
    p = {"input_ids": long_prompt, "return_logprob": True, "sampling_params": {"max_new_tokens": 5,
                                                                               "temperature": 0}}
    st, first = post("/generate", p)
    s = kv_settles()
    assert s["kv_cache"]["blocks_cached"] >= 3, s["kv_cache"]
    st, hit = post("/generate", p)
    s2 = kv_settles()
    assert s2["kv_cache"]["prefix_cache_hit_tokens"] > s["kv_cache"]["prefix_cache_hit_tokens"]
    st, r = post("/flush_cache", {})
    assert st == 200 and r["success"] is True and r["flushed_blocks"] >= 3, r
    s3 = get("/status")[1]
    assert s3["kv_cache"]["blocks_cached"] == 0 and s3["kv_cache"]["blocks_used"] == 0, s3["kv_cache"]
    st, after = post("/generate", p)
    s4 = kv_settles()
    assert s4["kv_cache"]["prefix_cache_hit_tokens"] == s3["kv_cache"]["prefix_cache_hit_tokens"], "no hit"
    for o in (hit, after):
        assert o["output_ids"] == first["output_ids"]
        assert o["meta_info"]["output_token_logprobs"] == first["meta_info"]["output_token_logprobs"]



CONVERSATION = [{"role": "system", "content": "You are a patient math tutor."},
                {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "2+2 is 4."},
                {"role": "user", "content": "And times 3? Explain step by step."}]


def _llama_template(name, msgs):
    """llama.cpp's built-in chat template `name` applied to msgs (generation prompt added)."""
    import ctypes
    import llama_cpp
    arr = (llama_cpp.llama_chat_message * len(msgs))(
        *[llama_cpp.llama_chat_message(role=m["role"].encode(), content=m["content"].encode()) for m in msgs])
    buf = ctypes.create_string_buffer(16384)
    n = llama_cpp.llama_chat_apply_template(name, arr, len(msgs), True, buf, 16384)
    assert 0 < n < 16384, n
    return buf.raw[:n].decode()


def _chat_prompt_ids(port, msgs):
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=120)
    # "" is the served model, whichever file (SmolLM2, Gemma 3) the daemon at port serves
    r = c.chat.completions.create(model="", messages=msgs, max_tokens=1, temperature=0,
                                  extra_body={"return_token_ids": True})
    return r.model_dump()["prompt_token_ids"]


@case
def multi_turn_chat_matches_the_templates():
    """A conversation of several turns is rendered by the model's chat format: for SmolLM2 (ChatML) the ids
    are llama.cpp's tokenization of the GGUF's own Jinja template rendered (and of llama.cpp's built-in
    chatml); for Gemma 3 of llama.cpp's built-in gemma template after the BOS (no template in that file)."""
    import jinja2.sandbox
    import llama_cpp
    r = GGUFReader(MODEL)
    f = r.fields["tokenizer.chat_template"]
    tmpl = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(
        bytes(f.parts[f.data[0]]).decode())
    text = tmpl.render(messages=CONVERSATION, add_generation_prompt=True)
    assert text == _llama_template(b"chatml", CONVERSATION), text
    llm = llama_cpp.Llama(model_path=MODEL, vocab_only=True, verbose=False)
    want = llm.tokenize(text.encode(), add_bos=False, special=True)
    got = _chat_prompt_ids(daemon().http_port, CONVERSATION)
    assert got == want, f"\n  ours      {got}\n  llama.cpp {want}"
    # developer is OpenAI's newer name for system; text parts are joined.
    dev = [{"role": "developer", "content": [{"type": "text", "text": "You are a patient "},
                                             {"type": "text", "text": "math tutor."}]}] + CONVERSATION[1:]
    assert _chat_prompt_ids(daemon().http_port, dev) == want
    gemma = os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf")
    if not os.path.exists(gemma):
        print("  (Gemma 3 not found: its half skipped)")
        return
    g = Daemon("--api-key-file", D_KEYFILE[0], model=gemma)
    try:
        ref = llama_cpp.Llama(model_path=gemma, vocab_only=True, verbose=False)
        text = "<bos>" + _llama_template(b"gemma", CONVERSATION)
        want = ref.tokenize(text.encode(), add_bos=False, special=True)
        got = _chat_prompt_ids(g.http_port, CONVERSATION)
        assert got == want, f"\n  ours      {got}\n  llama.cpp {want}"
        # Hugging Face's Gemma template: user and model turns alternate; anything else is refused by name.
        bad = CONVERSATION[:2] + [{"role": "user", "content": "again"}]
        try:
            _chat_prompt_ids(g.http_port, bad)
            raise AssertionError("two user turns in a row must be refused for Gemma")
        except openai.BadRequestError as ex:
            assert "alternating" in ex.body["message"] and "messages" in ex.body["message"], ex.body
    finally:
        stop_cleanly(g)

@case
def openai_models_and_auth():
    m = oai().models.list()
    assert len(m.data) == 1 and m.data[0].id, m
    bad = openai.OpenAI(base_url=f"http://127.0.0.1:{daemon().http_port}/v1", api_key="wrong", max_retries=0)
    try:
        bad.models.list()
        raise AssertionError("a wrong key must be refused")
    except openai.AuthenticationError:
        pass


# ---- SGLang-style /generate ----

@case
def slime_style_generate_loop():
    """A slime/AReaL rollout loop: batches of input_ids with return_logprob,
    resubmitting partial (abort) outputs until length or stop."""
    prompts = [[1, 504, 3458, 282, 4649, 314], [1, 9690, 314], PROMPT]
    for rnd in range(2):
        st, out = post("/generate", {"input_ids": prompts, "return_logprob": True,
                                     "sampling_params": {"max_new_tokens": 6, "temperature": 1.0, "top_p": 0.9,
                                                         "n": 2, "seed": 100 + rnd}})
        assert st == 200 and isinstance(out, list) and len(out) == 6, (st, out)
        for k, o in enumerate(out):
            mi = o["meta_info"]
            assert mi["prompt_tokens"] == len(prompts[k // 2])
            assert mi["completion_tokens"] == len(o["output_ids"]) == len(mi["output_token_logprobs"])
            assert [t[1] for t in mi["output_token_logprobs"]] == o["output_ids"]
            assert all(t[0] <= 0 and t[2] is None for t in mi["output_token_logprobs"])
            assert mi["finish_reason"]["type"] in ("stop", "length") and mi["logprob_kind"] == "raw"
            assert mi["seed"] == 100 + rnd
            assert mi["version_spans"] == [[0, len(o["output_ids"]), 0]] and mi["weight_version"] == "0"
    st, one = post("/generate", {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 3,
                                                                                          "temperature": 0}})
    assert st == 200 and isinstance(one, dict) and len(one["output_ids"]) == 3, one
    # A seed the daemon picked is reported whole, so the call can be replayed.
    st, pick = post("/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4}})
    st, again = post("/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4,
                                                                           "seed": pick["meta_info"]["seed"]}})
    assert again["output_ids"] == pick["output_ids"] and again["meta_info"]["seed"] == pick["meta_info"]["seed"]


@case
def bit_identical_with_the_nng_path():
    params = dict(n=3, max_tokens=12, temperature=0.8, top_p=0.95, top_k=40, seed=4242)
    with Client(daemon().url) as c:
        nng = c.generate([PROMPT], logprobs=3, **params)
    st, out = post("/generate", {"input_ids": PROMPT, "return_logprob": True, "top_logprobs_num": 3,
                                 "sampling_params": {"n": 3, "max_new_tokens": 12, "temperature": 0.8,
                                                     "top_p": 0.95, "top_k": 40, "seed": 4242}})
    assert st == 200 and len(out) == 3, out
    for s, o in zip(nng, out):
        assert s.token_ids.tolist() == o["output_ids"], (s.token_ids, o["output_ids"])
        lp = np.array([t[0] for t in o["meta_info"]["output_token_logprobs"]], dtype=np.float64)
        # cJSON prints at least 15 significant digits: enough for the float32 to round-trip exactly.
        assert np.array_equal(lp.astype(np.float32), s.logprobs), (lp, s.logprobs)
        top = np.array([[t[0] for t in row] for row in o["meta_info"]["output_top_logprobs"]], dtype=np.float32)
        assert np.array_equal(top, s.top_logprobs)
        assert [[t[1] for t in row] for row in o["meta_info"]["output_top_logprobs"]] == s.top_ids.tolist()
        assert s.finish_reason == o["meta_info"]["finish_reason"]["type"]
    # And through the OpenAI route.
    r = oai().completions.create(model=NAME, prompt=PROMPT, max_tokens=12, n=3, temperature=0.8, top_p=0.95,
                                 seed=4242, logprobs=0, extra_body={"top_k": 40, "return_token_ids": True})
    for s, ch in zip(nng, r.choices):
        assert ch.model_dump()["token_ids"] == s.token_ids.tolist()
        assert np.array_equal(np.array(ch.logprobs.token_logprobs, dtype=np.float32), s.logprobs)


@case
def stop_strings_across_tokens_and_at_the_first():
    base = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    st, full = post("/generate", base)
    assert st == 200 and full["text"].startswith(" Paris."), full
    ids = full["output_ids"]

    def with_stop(stop):
        b = json.loads(json.dumps(base))
        b["sampling_params"]["stop"] = stop
        st, o = post("/generate", b)
        assert st == 200, o
        return o

    # "is." spans " Paris" and ".": cut before it; the ids keep the token that completed it.
    o = with_stop("is.")
    assert o["text"] == " Par", o
    assert o["output_ids"] == ids[:2], (o["output_ids"], ids)
    assert o["meta_info"]["finish_reason"] == {"type": "stop", "matched": "is."}, o["meta_info"]
    # At the first token, in a list of stops.
    o = with_stop(["zzz", "Par"])
    assert o["text"] == " " and o["output_ids"] == ids[:1], o
    assert o["meta_info"]["finish_reason"]["matched"] == "Par"
    # OpenAI: excluded from the text, stop_reason names it.
    r = oai().completions.create(model=NAME, prompt="The capital of France is", max_tokens=8, temperature=0,
                                 stop=["is."])
    assert r.choices[0].text == " Par" and r.choices[0].finish_reason == "stop", r
    assert r.choices[0].model_dump()["stop_reason"] == "is."
    # A stop token id: matched names it, its text is not in the text.
    st, o = post("/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
    first = o["output_ids"][0]
    st, o2 = post("/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 8, "temperature": 0,
                                                                         "stop_token_ids": [first]}})
    assert o2["output_ids"] == [first] and o2["text"] == "", o2
    assert o2["meta_info"]["finish_reason"] == {"type": "stop", "matched": first}


def _long_generate(results, rid, key="out"):
    results[key] = post("/generate", {"input_ids": PROMPT, "rid": rid, "return_logprob": True,
                                      "sampling_params": {"max_new_tokens": 250, "ignore_eos": True,
                                                          "temperature": 0}})


def _wait_running(n=1):
    # Generous: an ASan daemon on a loaded 2-core machine can take many seconds to admit a request.
    deadline = time.time() + 90
    while get("/status")[1]["requests"]["running"] < n:
        assert time.time() < deadline, "the request never started"
        time.sleep(0.05)


@case
def abort_all_returns_partial_outputs():
    res = {}
    t = threading.Thread(target=_long_generate, args=(res, "long-1"))
    t.start()
    _wait_running()
    time.sleep(0.3)
    st, body = post("/abort_request", {"abort_all": True})
    assert st == 200 and body["aborted_requests"] == 1, body
    t.join(30)
    st, o = res["out"]
    assert st == 200 and o["meta_info"]["finish_reason"]["type"] == "abort", o["meta_info"]
    assert 0 < len(o["output_ids"]) < 250 and len(o["meta_info"]["output_token_logprobs"]) == len(o["output_ids"])
    # By rid.
    t = threading.Thread(target=_long_generate, args=(res, "long-2"))
    t.start()
    _wait_running()
    assert post("/abort_request", {"rid": "nope"})[1]["aborted_requests"] == 0
    assert post("/abort_request", {"rid": "long-2"})[1]["aborted_requests"] == 1
    t.join(30)
    assert res["out"][1]["meta_info"]["finish_reason"]["type"] == "abort"
    kv_settles()


@case
def pause_and_continue():
    res = {}
    # mode abort: the running request comes back aborted; new ones wait.
    t = threading.Thread(target=_long_generate, args=(res, "p1"))
    t.start()
    _wait_running()
    assert post("/pause_generation", {"mode": "abort"})[0] == 200
    t.join(30)
    assert res["out"][1]["meta_info"]["finish_reason"]["type"] == "abort"
    q = {}
    t2 = threading.Thread(target=lambda: q.update(r=post("/generate", {"input_ids": PROMPT,
                                                                       "sampling_params": {"max_new_tokens": 2}})))
    t2.start()
    time.sleep(1.0)
    assert "r" not in q and t2.is_alive(), "a paused server must hold new requests"
    assert get("/status")[1]["requests"]["running"] == 0
    # A held call that is aborted ends at once with no tokens; one whose client leaves is dropped.
    held = {}
    t4 = threading.Thread(target=lambda: held.update(r=post("/generate", {
        "input_ids": PROMPT, "rid": "held", "sampling_params": {"max_new_tokens": 2}})))
    t4.start()
    s = _raw_request({"input_ids": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": 2}}, True)
    time.sleep(0.3)
    s.close()
    assert post("/abort_request", {"rid": "held"})[1]["aborted_requests"] == 1
    t4.join(10)
    assert held["r"][1]["output_ids"] == [] and held["r"][1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert "r" not in q, "only the aborted call ended"
    assert post("/continue_generation", {})[0] == 200
    t2.join(30)
    assert q["r"][0] == 200 and len(q["r"][1]["output_ids"]) == 2, q
    # mode wait: answers once the running request has finished (not aborted).
    short = {}
    t3 = threading.Thread(target=lambda: short.update(r=post("/generate", {
        "input_ids": PROMPT, "sampling_params": {"max_new_tokens": 20, "ignore_eos": True}})))
    t3.start()
    try:
        _wait_running()
        st, _ = post("/pause_generation", {"mode": "wait"})
        # The generation's answer went out just before the pause's.
        assert st == 200 and get("/status")[1]["requests"]["running"] == 0
        t3.join(5)
        assert short["r"][1]["meta_info"]["finish_reason"]["type"] == "length", short
        assert len(short["r"][1]["output_ids"]) == 20
    finally:
        assert post("/continue_generation", {})[0] == 200
    kv_settles()


# ---- errors, busy, clients that leave ----

@case
def bad_fields_get_400_naming_them():
    cases = [
        ({"input_ids": PROMPT, "sampling_params": {"temperature": "hot"}}, "temperature"),
        ({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 0}}, "max_new_tokens"),
        ({"input_ids": [1, -5]}, "input_ids"),
        ({"sampling_params": {}}, "input_ids"),
        ({"input_ids": PROMPT, "sampling_params": {"stop": [3]}}, "stop"),
        ({"input_ids": [60000]}, "vocab"),
    ]
    for body, field in cases:
        st, e = post("/generate", body)
        assert st == 400 and field in e["detail"], (body, st, e)
    d = daemon()
    c = http.client.HTTPConnection("127.0.0.1", d.http_port, timeout=10)
    c.request("POST", "/v1/completions", body=b"{not json", headers={"Authorization": f"Bearer {KEY}"})
    r = c.getresponse()
    assert r.status == 400 and "JSON" in json.loads(r.read())["error"]["message"]
    c.close()
    assert post("/generate", {"input_ids": PROMPT}, key=None)[0] == 401


@case
def busy_gets_503_with_the_nng_words():
    st, e = post("/generate", {"input_ids": [PROMPT] * 65, "sampling_params": {"max_new_tokens": 1}})
    assert st == 503 and "max_queued_requests" in e["detail"], (st, e)


def _raw_request(body, read_headers):
    d = daemon()
    s = socket.create_connection(("127.0.0.1", d.http_port), timeout=10)
    data = json.dumps(body).encode()
    s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
              b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(data)).encode() +
              b"\r\n\r\n" + data)
    if read_headers:
        got = b""
        while b"\r\n\r\n" not in got:
            got += s.recv(4096)
        assert got.startswith(b"HTTP/1.1 200") and b"text/event-stream" in got, got
    return s


@case
def clients_that_leave_free_their_kv_blocks():
    long = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 250, "ignore_eos": True, "n": 2}}
    for stream in (False, True):
        s = _raw_request({**long, "stream": stream}, read_headers=stream)
        _wait_running(2)
        assert get("/status")[1]["kv_cache"]["blocks_used"] > 0
        s.close()
        st = kv_settles()
        assert st["requests"]["aborted"] >= 2
    st, o = post("/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 3}})
    assert st == 200 and len(o["output_ids"]) == 3


@case
def model_info_health_generate_flush():
    st, mi = get("/get_model_info")
    assert st == 200 and mi["is_generation"] is True and mi["model_path"].endswith(".gguf"), mi
    assert mi["weight_version"] == "0"
    assert get("/health_generate") == (200, {"status": "ok"})


@case
def update_weights_from_disk():
    st, before = post("/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 6, "temperature": 0}})
    v = int(get("/get_model_info")[1]["weight_version"])
    # A file that is not there: refused, the old weights keep serving.
    st, r = post("/update_weights_from_disk", {"model_path": os.path.join(TMP, "no-such.safetensors")})
    assert st == 400 and r["success"] is False and "no-such" in r["message"], r
    assert get("/get_model_info")[1]["weight_version"] == str(v)
    # The same GGUF again, as the next version, through the daemon's own push path.
    st, r = post("/update_weights_from_disk", {"model_path": MODEL, "weight_version": str(v + 1)},
                 timeout=120)
    assert st == 200 and r["success"] is True and r["weight_version"] == str(v + 1), r
    st, after = post("/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 6, "temperature": 0}})
    assert after["output_ids"] == before["output_ids"], "the same weights give the same tokens"
    assert after["meta_info"]["weight_version"] == str(v + 1)
    assert after["meta_info"]["version_spans"] == [[0, 6, v + 1]], after["meta_info"]


# After the cases that expect weight version 0: it swaps in version + 1.
@case
def pause_keep_freezes_and_continue_resumes():
    kv_settles()  # nothing of the earlier cases still runs or waits
    res = {}
    t = threading.Thread(target=_long_generate, args=(res, "frozen"))
    t.start()
    _wait_running()
    time.sleep(0.3)
    assert post("/pause_generation", {"mode": "keep"}) == (200, {"success": True})
    # /status is the engine's state after its last step: the pause shows once the step in flight ends
    # (under ASan on a loaded machine a step can take longer than any fixed sleep).
    deadline = time.time() + 60
    while True:
        s0 = get("/status")[1]
        if s0["generation_paused"] is True or time.time() > deadline:
            break
        time.sleep(0.05)
    assert s0["generation_paused"] is True and s0["requests"]["running"] == 1, s0
    g0 = s0["tokens"]["generated_total"]
    time.sleep(1.0)
    s1 = get("/status")[1]
    assert s1["tokens"]["generated_total"] == g0, "a frozen sequence made tokens"
    assert s1["kv_cache"]["blocks_used"] > 0 and "out" not in res, "it keeps its KV and is not answered"
    # A weight update swaps in between: the sequence goes on under the new version.
    v = int(get("/get_model_info")[1]["weight_version"])
    st, r = post("/update_weights_from_disk", {"model_path": MODEL, "weight_version": str(v + 1)}, timeout=120)
    assert st == 200 and r["success"] is True, r
    assert get("/status")[1]["tokens"]["generated_total"] == g0
    assert post("/continue_generation", {})[0] == 200
    t.join(180)
    st, o = res["out"]
    assert st == 200 and o["meta_info"]["finish_reason"]["type"] == "length" and len(o["output_ids"]) == 250, o
    spans = o["meta_info"]["version_spans"]
    assert len(spans) == 2 and spans[0][2] == v and spans[1][2] == v + 1 and spans[1][1] == 250, spans
    assert get("/status")[1]["generation_paused"] is False
    kv_settles()


@case
def sigterm_exits_zero():
    d = daemon()
    # One request still running at SIGTERM, frozen by a keep pause: the drain unfreezes it (it samples on),
    # then aborts it; it is answered, the daemon exits 0.
    res = {}
    g_before = get("/status")[1]["tokens"]["generated_total"]
    t = threading.Thread(target=lambda: res.update(r=post("/generate", {
        "input_ids": PROMPT, "sampling_params": {"max_new_tokens": 250, "ignore_eos": True}})))
    t.start()
    _wait_running()
    assert post("/pause_generation", {"mode": "keep"})[0] == 200
    time.sleep(0.3)
    frozen = get("/status")[1]["tokens"]["generated_total"] - g_before
    d.proc.send_signal(signal.SIGTERM)
    t.join(30)
    d.exits_cleanly()
    assert res["r"][0] == 200 and res["r"][1]["meta_info"]["finish_reason"]["type"] in ("abort", "length"), res
    assert len(res["r"][1]["output_ids"]) > frozen, (frozen, len(res["r"][1]["output_ids"]))


if __name__ == "__main__":
    try:
        main()
    finally:
        if D is not None:
            D.kill()
