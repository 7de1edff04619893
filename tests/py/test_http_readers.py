"""What tests/fuzz/fuzz_http_json.c found in the HTTP request readers (daemon/api_read.c), checked
end to end on a real build/rolloutd serving a tiny model (build/testdata):

- an error answer is valid UTF-8 JSON even when its detail quotes the body: a role cut at 40
  bytes in the middle of a character, a weight_version with a byte that is not UTF-8 (each such
  byte becomes '?');
- /update_weights_from_disk refuses versions past 2^62 - 1 in both forms: the number
  4611686018427387904 (2^62, which the old double comparison let through) and the string
  "99999999999999999999" (strtoll saturates to INT64_MAX), naming the field; 2^62 - 1 as a string
  and 2^62 - 512 as a number (the largest double below 2^62) pass the reader (the answer is then
  about model_path, which does not exist);
- the readers moved out of the handlers still answer as before: a /generate and a
  /v1/chat/completions call give tokens, /abort_request needs a rid, /pause_generation refuses an
  unknown mode, and pause + continue work;
- the readers of vLLM's and SGLang's RL routes (daemon/api_read_rl.c) refuse bad bodies and query
  strings naming the field, and valid calls still work.
The daemon ends with SIGTERM and must exit 0."""
import json
import os
import sys
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, case, main  # noqa: E402

from rdtest import Daemon, stop_cleanly  # noqa: E402

TESTDATA = os.path.join(ROOT, os.environ.get("RD_TESTDATA", "build/testdata"))
MODEL = os.path.join(TESTDATA, "tiny-qwen2.gguf")   # a ChatML vocabulary: chat calls render

_d = []


def daemon():
    if not _d:
        assert os.path.exists(MODEL), f"{MODEL} is missing: run tests/gen_testdata.sh"
        _d.append(Daemon(model=MODEL))
    return _d[0]


def post_raw(path, body, timeout=60):
    """(status, raw answer bytes) of a POST of the bytes body."""
    req = urllib.request.Request(f"http://127.0.0.1:{daemon().http_port}{path}", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def post(path, obj, timeout=60):
    st, raw = post_raw(path, json.dumps(obj).encode(), timeout)
    return st, json.loads(raw.decode("utf-8"))


def detail(doc):
    """The message of an error answer in either shape (SGLang's or OpenAI's)."""
    if isinstance(doc.get("error"), dict):
        return doc["error"]["message"]
    return json.dumps(doc)


@case
def error_answers_are_utf8_json():
    # 'a' + 30 x U+00E9: the detail quotes 40 bytes of it, which ends inside a character.
    role = "a" + "\u00e9" * 30
    st, raw = post_raw("/v1/chat/completions",
                       json.dumps({"messages": [{"role": role, "content": "x"}]}, ensure_ascii=False).encode())
    assert st == 400, (st, raw)
    doc = json.loads(raw.decode("utf-8"))  # strict: raises on invalid UTF-8
    msg = detail(doc)
    assert "role" in msg and "cannot be rendered" in msg, msg
    assert "a" + "\u00e9" * 19 in msg, msg
    st, raw = post_raw("/update_weights_from_disk", b'{"model_path":"m.gguf","weight_version":"7\xff"}')
    assert st == 400, (st, raw)
    msg = json.dumps(json.loads(raw.decode("utf-8")))
    assert "weight_version" in msg and "7?" in msg, msg


@case
def update_versions_bounded():
    for body in ({"model_path": "/nonexistent.gguf", "version": 4611686018427387904},
                 {"model_path": "/nonexistent.gguf", "weight_version": 4611686018427387904},
                 {"model_path": "/nonexistent.gguf", "weight_version": "99999999999999999999"},
                 {"model_path": "/nonexistent.gguf", "weight_version": "4611686018427387904"}):
        st, doc = post("/update_weights_from_disk", body)
        field = "version" if "version" in body else "weight_version"
        msg = json.dumps(doc)
        assert st == 400 and f'field \\"{field}\\"' in msg, (body, st, msg)
    # The largest double below 2^62 as a number (2^62 - 1 itself parses as 2^62), 2^62 - 1 as a string.
    for body in ({"model_path": "/nonexistent.gguf", "version": 4611686018427387392},
                 {"model_path": "/nonexistent.gguf", "weight_version": "4611686018427387903"}):
        st, doc = post("/update_weights_from_disk", body, timeout=120)
        msg = json.dumps(doc)
        assert st == 400 and "model_path" in msg and "version\\\"" not in msg, (body, st, msg)


@case
def moved_readers_answer_as_before():
    st, doc = post("/generate", {"input_ids": [5, 17, 42], "sampling_params": {"max_new_tokens": 3, "temperature": 0}})
    assert st == 200 and len(doc["output_ids"]) == 3, (st, doc)
    st, doc = post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                            "temperature": 0})
    assert st == 200 and doc["usage"]["completion_tokens"] >= 1, (st, doc)
    st, doc = post("/v1/completions", {"prompt": [5, 17], "max_tokens": 2, "n": 0})
    assert st == 400 and '"n" = 0' in detail(doc), (st, doc)
    st, doc = post("/abort_request", {})
    assert st == 400 and "rid" in json.dumps(doc), (st, doc)
    st, doc = post("/abort_request", {"rid": "nobody"})
    assert st == 200 and doc["aborted_requests"] == 0, (st, doc)
    st, doc = post("/pause_generation", {"mode": "later"})
    assert st == 400 and "mode" in json.dumps(doc), (st, doc)
    st, doc = post("/pause_generation", {"mode": "keep"})
    assert st == 200 and doc["success"], (st, doc)
    st, doc = post("/continue_generation", {})
    assert st == 200 and doc["success"], (st, doc)
    st, doc = post("/generate", {"text": "ab", "sampling_params": {"max_new_tokens": 2}})
    assert st == 200 and len(doc["output_ids"]) == 2, (st, doc)


@case
def rl_readers_answer_as_before():
    """vLLM's and SGLang's RL routes on the readers of daemon/api_read_rl.c: refusals name the field or
    query parameter; a string weight_version past 2^62 - 1 is refused on vLLM's /update_weights as on
    /update_weights_from_disk; valid calls still work."""
    vocab = 300  # tiny-qwen2's
    for q in ("mode=later", "clear_cache=maybe", "mode=" + "k" * 40):
        st, doc = post("/pause?" + q, {})
        assert st == 400 and ("mode" in json.dumps(doc) or "clear_cache" in json.dumps(doc)), (q, st, doc)
    st, doc = post("/reset_prefix_cache?reset_external=perhaps", {})
    assert st == 400 and "reset_external" in json.dumps(doc), (st, doc)
    st, doc = post("/sleep?level=3", {})
    assert st == 400 and "level" in json.dumps(doc), (st, doc)
    st, doc = post("/wake_up?tags=gpu", {})
    assert st == 400 and "tags" in json.dumps(doc), (st, doc)
    st, doc = post("/release_memory_occupation", {"tags": "weights"})
    assert st == 400 and "tags" in json.dumps(doc), (st, doc)
    st, doc = post("/abort_requests", {"request_ids": ["a", 1]})
    assert st == 400 and "request_ids" in json.dumps(doc), (st, doc)
    st, doc = post("/detokenize", {"tokens": [1, vocab]})
    assert st == 400 and "tokens" in detail(doc), (st, doc)
    st, doc = post("/detokenize", {"tokens": [1.5]})
    assert st == 400 and "tokens" in detail(doc), (st, doc)
    st, doc = post("/update_weights", {"update_info": {"path": "/nonexistent", "weight_version": "99999999999999999999"}})
    assert st == 400 and "weight_version" in json.dumps(doc), (st, doc)
    st, doc = post("/update_weights", {"update_info": {"path": "x" * 600}})
    assert st == 400 and "path" in json.dumps(doc), (st, doc)
    st, doc = post("/init_weight_transfer_engine", {"init_info": {"master_address": "h", "master_port": 1}})
    assert st == 501 and "NCCL" in json.dumps(doc), (st, doc)
    st, doc = post("/inference/v1/generate", {"token_ids": [5, 17], "sampling_params": {"presence_penalty": 2.5}})
    assert st == 400 and "presence_penalty" in detail(doc), (st, doc)
    st, doc = post("/inference/v1/generate", {"token_ids": [5, 17], "sampling_params": {"allowed_token_ids": [3]}})
    assert st == 400 and "allowed_token_ids" in detail(doc), (st, doc)
    # Valid calls: tokenize then detokenize round-trips, token-in generation gives tokens.
    st, doc = post("/tokenize", {"prompt": "ab ab", "add_special_tokens": False})
    assert st == 200 and doc["count"] == len(doc["tokens"]) >= 1, (st, doc)
    st, back = post("/detokenize", {"tokens": doc["tokens"]})
    assert st == 200 and back["prompt"] == "ab ab", (st, back)
    st, doc = post("/inference/v1/generate", {"token_ids": [5, 17, 42],
                                              "sampling_params": {"max_tokens": 3, "temperature": 0, "logprobs": 1}})
    assert st == 200 and len(doc["choices"][0]["token_ids"]) == 3, (st, doc)
    st, doc = post("/pause?mode=keep", {})
    assert st == 200 and doc["status"] == "paused", (st, doc)
    st, doc = post("/resume", {})
    assert st == 200 and doc["status"] == "resumed", (st, doc)


@case
def daemon_exits_cleanly():
    stop_cleanly(daemon())


if __name__ == "__main__":
    main()
