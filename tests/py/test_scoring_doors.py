"""Scoring through vLLM's and OpenAI's doors (issue 45): prompt_logprobs on /inference/v1/generate (prime-rl's
prefill_logprobs, sent by the openai package's client as prime-rl sends it), on /v1/completions and on chat;
echo with logprobs on /v1/completions (lm-evaluation-harness's log-likelihood call, parsed as lm-eval parses
it); and scoring under --logprobs-mode processed_logprobs.

- Rescoring is exact at each door: rollouts (greedy, T=1, top-p with n=4) scored as prompt + completion give,
  at every completion position, the float32 bits their sampled log-probs had; the same in a busy engine.
- The layouts: vLLM's (a list, None first, {id: {logprob, rank, decoded_token}} with the prompt token first and
  ranks counted as vLLM counts them); echo's prompt-then-completion with null first.
- lm-eval's two-choice log-likelihood picks what llama.cpp (logits_all through llama-cpp-python, same file)
  picks, with sums within 0.05 nats, and SGLang's door gives the same numbers.
- Processed mode: scored tokens carry the processed log-prob a draw of them had, -9999 where truncation drops
  them.
The daemons end with SIGTERM and must exit 0."""
import os
import struct
import sys
import threading

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import MODEL, case, main  # noqa: E402

from rdtest import Daemon, stop_cleanly  # noqa: E402

PROMPT = "The history of the printing press in Europe began"
_d = {}


def daemon(mode="raw_logprobs"):
    if mode not in _d:
        _d[mode] = Daemon("--logprobs-mode", mode, model=MODEL)
    return _d[mode]


def post(path, obj, mode="raw_logprobs"):
    return daemon(mode).post(path, obj)


def ids_of(text):
    st, doc = post("/tokenize", {"prompt": text})
    assert st == 200, doc
    return doc["tokens"]


def bits(xs):
    return [struct.unpack("<I", struct.pack("<f", x))[0] for x in xs]


def openai_client(mode="raw_logprobs"):
    import openai
    return openai.OpenAI(base_url=f"http://127.0.0.1:{daemon(mode).http_port}/v1", api_key="none", max_retries=0)


def prefill_logprobs(token_ids):
    """prime-rl's prefill_logprobs (utils/client.py): the openai client posts to /inference/v1/generate with
    prompt_logprobs 1 and reads, per position, the first entry's logprob (0.0 for the leading token)."""
    try:
        import httpx
    except ImportError:  # the openai package's own HTTP layer under its newer name
        import httpx2 as httpx
    client = openai_client()
    base = str(client.base_url).rstrip("/").removesuffix("/v1")
    resp = client.post(f"{base}/inference/v1/generate", cast_to=httpx.Response,
                       body={"model": "", "token_ids": token_ids,
                             "sampling_params": {"max_tokens": 1, "temperature": 1.0, "top_p": 1.0,
                                                 "prompt_logprobs": 1}})
    doc = resp.json()
    out = []
    for entry in doc["prompt_logprobs"] or []:
        if not entry:
            out.append(0.0)
            continue
        first = next(iter(entry.values()))
        out.append(float(first["logprob"]))
    return out, doc


SAMPLINGS = ({"temperature": 0}, {"temperature": 1.0, "seed": 3, "n": 4},
             {"temperature": 0.8, "top_p": 0.9, "seed": 4, "n": 4})
PROMPTS = (PROMPT, "Write a short poem about the sea:", "def fibonacci(n):", "Q: 17 * 23 = ? A:")


def vllm_rollouts(ids):
    """(completion ids, sampled log-probs) from /inference/v1/generate: 9 seeded rollouts."""
    out = []
    for sp in SAMPLINGS:
        st, doc = post("/inference/v1/generate", {"token_ids": ids, "sampling_params": {
            "max_tokens": 20, "ignore_eos": True, "logprobs": 0, **sp}})
        assert st == 200, doc
        for ch in doc["choices"]:
            out.append((ch["token_ids"], [e["logprob"] for e in ch["logprobs"]["content"]]))
    assert len(out) == 9, len(out)
    return out


@case
def prime_rl_prefill_logprobs_rescores_exactly():
    """36 rollouts (4 prompts: greedy, T=1 and top-p with n=4)."""
    rolls = [(ids_of(p), r) for p in PROMPTS for r in vllm_rollouts(ids_of(p))]
    assert len(rolls) == 36
    for ids, (toks, lps) in rolls:
        got, doc = prefill_logprobs(ids + toks)
        assert len(got) == len(ids) + len(toks) and doc["prompt_logprobs"][0] is None, doc
        assert bits(got[len(ids):]) == bits(lps), (got[len(ids):], lps)
        # vLLM's layout: the prompt token first, then the most likely one (rank 1) when it is another
        for p, entry in enumerate(doc["prompt_logprobs"][1:], 1):
            keys = list(entry)
            assert keys[0] == str((ids + toks)[p]) and 1 <= len(entry) <= 2, entry
            first = entry[keys[0]]
            assert first["rank"] >= 1 and isinstance(first["decoded_token"], str), entry
            if len(entry) == 2:
                assert entry[keys[1]]["rank"] == 1 and first["rank"] > 1, entry
                assert entry[keys[1]]["logprob"] >= first["logprob"], entry
            else:
                assert first["rank"] == 1, entry


@case
def completions_prompt_logprobs_and_echo_rescore_exactly():
    ids = ids_of(PROMPT)
    rolls = []
    for sp in SAMPLINGS:
        st, doc = post("/v1/completions", {"prompt": ids, "max_tokens": 16, "ignore_eos": True, "logprobs": 2,
                                           "return_token_ids": True, **sp})
        assert st == 200, doc
        rolls += [(c["token_ids"], c["logprobs"]["token_logprobs"]) for c in doc["choices"]]
    for toks, lps in rolls:
        seq = ids + toks
        st, doc = post("/v1/completions", {"prompt": seq, "max_tokens": 0, "echo": True, "logprobs": 2})
        assert st == 200, doc
        ch = doc["choices"][0]
        lp = ch["logprobs"]
        assert len(lp["tokens"]) == len(seq) and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert bits(lp["token_logprobs"][len(ids):]) == bits(lps), (lp["token_logprobs"][len(ids):], lps)
        # each top_logprobs dict: the token and up to 2 alternatives
        assert all(1 <= len(d) <= 3 for d in lp["top_logprobs"][1:]), lp["top_logprobs"]
        assert lp["text_offset"] == sorted(lp["text_offset"]), lp["text_offset"]
        # prompt_logprobs beside it, the same numbers
        st, doc = post("/v1/completions", {"prompt": seq, "max_tokens": 0, "prompt_logprobs": 0})
        assert st == 200, doc
        pl = doc["choices"][0]["prompt_logprobs"]
        assert pl[0] is None and all(len(d) == 1 for d in pl[1:]), pl
        assert bits([d[str(t)]["logprob"] for d, t in zip(pl[len(ids):], toks)]) == bits(lps)
    # echo without logprobs: the prompt's text before the completion's
    st, doc = post("/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "echo": True, "temperature": 0})
    assert st == 200 and doc["choices"][0]["text"].startswith(PROMPT), doc
    st, plain = post("/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "temperature": 0})
    assert doc["choices"][0]["text"] == PROMPT + plain["choices"][0]["text"], (doc, plain)


@case
def chat_prompt_logprobs():
    msgs = [{"role": "user", "content": PROMPT}]
    st, doc = post("/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "prompt_logprobs": 3,
                                            "return_token_ids": True, "temperature": 0})
    assert st == 200, doc
    pl, toks = doc["prompt_logprobs"], doc["prompt_token_ids"]
    assert len(pl) == len(toks) and pl[0] is None, doc
    assert all(str(t) in d and 3 <= len(d) <= 4 for t, d in zip(toks[1:], pl[1:])), pl


@case
def rescoring_in_a_busy_engine():
    ids = ids_of(PROMPT)
    rolls = vllm_rollouts(ids)
    stop = threading.Event()
    errors = []

    def busy(k):
        while not stop.is_set():
            st, doc = post("/inference/v1/generate", {"token_ids": ids_of(f"Story {k}: once"), "sampling_params": {
                "max_tokens": 24, "temperature": 1.0, "seed": k, "n": 2}})
            if st != 200:
                errors.append(doc)

    threads = [threading.Thread(target=busy, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    try:
        for toks, lps in rolls:
            got, _ = prefill_logprobs(ids + toks)
            assert bits(got[len(ids):]) == bits(lps), (got[len(ids):], lps)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors


def lm_eval_parse(choice, ctxlen):
    """lm-evaluation-harness's parse_logprobs for local-completions: the continuation's log-likelihood
    (token_logprobs[ctxlen:-1]: the last token is the one generated) and whether it is greedy."""
    lps = choice.logprobs.token_logprobs[ctxlen:-1]
    tops = choice.logprobs.top_logprobs[ctxlen:-1]
    return sum(lps), all(t == max(top.values()) for t, top in zip(lps, tops))


@case
def lm_eval_two_choice_loglikelihood_matches_llama_cpp():
    """On the F32 export, where both engines compute the same function (the Q4_1 file's activations are
    quantized by llama.cpp and not by rolloutd)."""
    from test_llamacpp_parity import f32_copy, llama_logits, log_softmax
    f32 = f32_copy()
    if "f32" not in _d:
        _d["f32"] = Daemon(model=f32)
    import openai
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{_d['f32'].http_port}/v1", api_key="none", max_retries=0)
    ctx = ids_of("Question: What is the capital of France? Answer:")
    choices = [ids_of(" Paris")[-1:], ids_of(" a banana")[-2:]]
    # lm-eval's _create_payload for log-likelihood: token prompts, echo, logprobs 1, max_tokens 1
    resp = client.completions.create(model="", prompt=[ctx + c for c in choices], temperature=0, max_tokens=1,
                                     logprobs=1, echo=True, seed=1234)
    ours = [lm_eval_parse(ch, len(ctx)) for ch in sorted(resp.choices, key=lambda c: c.index)]
    ref = []
    for c in choices:
        seq = ctx + c
        lsm = log_softmax(llama_logits(seq, kind="f32"))
        ref.append(sum(lsm[p - 1, seq[p]] for p in range(len(ctx), len(seq))))
    print(f"# log-likelihoods: rolloutd {[round(x[0], 4) for x in ours]}, llama.cpp {[round(x, 4) for x in ref]}")
    assert int(np.argmax([x[0] for x in ours])) == int(np.argmax(ref)), (ours, ref)
    assert all(abs(a[0] - b) < 5e-3 for a, b in zip(ours, ref)), (ours, ref)
    # lm-eval's sglang-generate model sends /generate with logprob_start_len 0: the same numbers
    for c, (ll, _) in zip(choices, ours):
        st, doc = _d["f32"].post("/generate", {"input_ids": ctx + c, "sampling_params": {
            "max_new_tokens": 1, "temperature": 0}, "logprob_start_len": 0, "top_logprobs_num": 1,
            "return_logprob": True})
        assert st == 200, doc
        got = sum(x[0] for x in doc["meta_info"]["input_token_logprobs"][len(ctx):])
        assert abs(got - ll) < 1e-9, (got, ll)


@case
def processed_mode_scores_what_the_draw_had():
    ids = ids_of(PROMPT)
    for sp in ({"temperature": 0.8, "top_p": 0.9, "sampling_seed": 5},
               {"temperature": 1.2, "top_k": 40, "min_p": 0.02, "sampling_seed": 6, "n": 2},
               {"temperature": 0}):
        st, doc = post("/generate", {"input_ids": ids, "return_logprob": True, "sampling_params": {
            "max_new_tokens": 16, "ignore_eos": True, **sp}}, mode="processed_logprobs")
        assert st == 200, doc
        for g in doc if isinstance(doc, list) else [doc]:
            mi = g["meta_info"]
            assert mi["logprob_kind"] == "processed", mi
            lps = [t[0] for t in mi["output_token_logprobs"]]
            sp1 = {k: v for k, v in sp.items() if k != "n"}
            st, sc = post("/generate", {"input_ids": ids + g["output_ids"], "return_logprob": True,
                                        "logprob_start_len": len(ids), "sampling_params": {
                                            "max_new_tokens": 0, **sp1}}, mode="processed_logprobs")
            assert st == 200, sc
            assert sc["meta_info"]["input_logprob_kind"] == "processed", sc["meta_info"]
            got = [t[0] for t in sc["meta_info"]["input_token_logprobs"]]
            assert bits(got) == bits(lps), (got, lps)
    # a prompt token top-k 1 drops (not the argmax) gets vLLM's -9999
    st, sc = post("/generate", {"input_ids": ids, "return_logprob": True, "logprob_start_len": 1,
                                "sampling_params": {"max_new_tokens": 0, "temperature": 1.0, "top_k": 1}},
                  mode="processed_logprobs")
    got = [t[0] for t in sc["meta_info"]["input_token_logprobs"]]
    assert all(x in (0.0, -9999.0) for x in got) and -9999.0 in got, got


@case
def refusals():
    ids = ids_of(PROMPT)
    for path, body, word in (
            ("/v1/completions", {"prompt": ids, "prompt_logprobs": -1}, "prompt_logprobs"),
            ("/v1/completions", {"prompt": ids, "prompt_logprobs": 21}, "prompt_logprobs"),
            ("/v1/completions", {"prompt": ids, "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
            ("/v1/completions", {"prompt": ids, "echo": True, "stream": True}, "echo"),
            ("/v1/completions", {"prompt": ids, "max_tokens": 0}, "max_tokens"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "echo": True}, "echo"),
            ("/inference/v1/generate", {"token_ids": ids, "sampling_params": {"max_tokens": 0}}, "max_tokens"),
            ("/inference/v1/generate", {"token_ids": ids, "sampling_params": {"max_tokens": 0, "n": 2,
                                                                              "prompt_logprobs": 0}}, "n")):
        st, doc = post(path, body)
        assert st == 400 and word in str(doc), (path, body, st, doc)
    st, _ = post("/v1/completions", {"prompt": ids, "max_tokens": 2})
    assert st == 200


@case
def daemons_exit_cleanly():
    for d in _d.values():
        stop_cleanly(d)
    _d.clear()


if __name__ == "__main__":
    main()
