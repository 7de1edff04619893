"""Scoring through SGLang's /generate (issue 45, first door): the prompt's tokens scored from
logprob_start_len on (meta_info.input_token_logprobs, input_top_logprobs), with max_new_tokens 0
to score only, as slime's on-policy distillation calls it (slime/rollout/on_policy_distillation.py).

- Rescoring is exact: rollouts of the default model (greedy, T=1, top-p with n=4: 7 in all) scored
  as prompt + completion from the completion's first position give, at every completion position,
  the bits their output_token_logprobs had; the same while 12 other requests keep the engine busy.
- Against a reference: the prompt log-probs equal log_softmax of build/rollout-logits' rows within
  1e-5 (a 300-token prompt: scored a chunk per step), and llama.cpp's (logits_all, through
  llama-cpp-python) within 2e-3 nats on the default model's F32 export.
- slime's call is answered in SGLang's layout (one entry per position, position 0's log-prob null,
  [logprob, id, text]); a cached prompt is recomputed, not skipped; refusals name the field.
The daemons end with SIGTERM and must exit 0."""
import os
import sys
import threading

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, MODEL, TMP, case, main, run  # noqa: E402

from rdtest import Daemon, stop_cleanly  # noqa: E402

PROMPT = "The history of the printing press in Europe began"
_d = {}


def daemon(model=MODEL):
    if model not in _d:
        _d[model] = Daemon(model=model)
    return _d[model]


def post(path, obj, model=MODEL):
    return daemon(model).post(path, obj)


def ids_of(text):
    st, doc = post("/tokenize", {"prompt": text})
    assert st == 200, doc
    return doc["tokens"]


def score(ids, start, top=0, model=MODEL):
    st, doc = post("/generate", {"input_ids": ids, "return_logprob": True, "logprob_start_len": start,
                                 "top_logprobs_num": top, "sampling_params": {"max_new_tokens": 0}}, model)
    assert st == 200, doc
    assert doc["output_ids"] == [] and doc["meta_info"]["completion_tokens"] == 0, doc
    return doc["meta_info"]


def rollouts(ids):
    out = []
    for sp in ({"temperature": 0}, {"temperature": 1.0, "sampling_seed": 3},
               {"temperature": 0.8, "top_p": 0.9, "sampling_seed": 4, "n": 4},
               {"temperature": 1.0, "sampling_seed": 9, "repetition_penalty": 1.3}):
        st, g = post("/generate", {"input_ids": ids, "return_logprob": True, "top_logprobs_num": 2,
                                   "sampling_params": {"max_new_tokens": 24, "ignore_eos": True, **sp}})
        assert st == 200, g
        out += g if isinstance(g, list) else [g]
    return out


def check_rescored(ids, rs):
    for g in rs:
        comp = g["output_ids"]
        mi = score(ids + comp, len(ids), top=2)
        got = mi["input_token_logprobs"]
        assert [t[1] for t in got] == comp, (got, comp)
        assert [t[0] for t in got] == [t[0] for t in g["meta_info"]["output_token_logprobs"]], "log-probs differ"
        assert mi["input_top_logprobs"] == g["meta_info"]["output_top_logprobs"], "alternatives differ"


@case
def rescoring_gives_the_sampled_bits():
    ids = ids_of(PROMPT)
    rs = rollouts(ids)
    assert len(rs) == 7
    check_rescored(ids, rs)


@case
def rescoring_in_a_busy_engine():
    ids = ids_of(PROMPT)
    rs = rollouts(ids)
    errors = []

    def busy(k):
        st, doc = post("/generate", {"text": f"Story number {k}:", "sampling_params": {
            "max_new_tokens": 48, "temperature": 1.0, "sampling_seed": k, "ignore_eos": True}})
        if st != 200:
            errors.append(doc)

    threads = [threading.Thread(target=busy, args=(k,)) for k in range(12)]
    for t in threads:
        t.start()
    check_rescored(ids, rs)
    for t in threads:
        t.join()
    assert not errors, errors


def raw_logits(ids, model=MODEL):
    path = os.path.join(TMP, "scoring_logits.bin")
    run([os.path.join(BUILD, "rollout-logits"), "--model", model, "--prompt-ids", ",".join(map(str, ids)),
         "--out", path, "--threads", "2"])
    return np.fromfile(path, dtype=np.float32).reshape(len(ids), -1).astype(np.float64)


def log_softmax(z):
    mx = z.max(axis=-1, keepdims=True)
    return z - mx - np.log(np.exp(z - mx).sum(axis=-1, keepdims=True))


@case
def long_prompt_against_rollout_logits():
    text = " ".join(f"Item {i} is {i * i}." for i in range(60))
    ids = ids_of(text)
    assert len(ids) > 200, len(ids)
    mi = score(ids, 0)
    got = mi["input_token_logprobs"]
    assert len(got) == len(ids) and got[0][0] is None and [t[1] for t in got] == ids, got[:3]
    ref = log_softmax(raw_logits(ids))
    want = np.array([ref[p - 1, ids[p]] for p in range(1, len(ids))])
    err = np.max(np.abs(np.array([t[0] for t in got[1:]]) - want))
    assert err <= 1e-5, err
    # A second time the prompt's blocks are in the prefix cache: scored positions are recomputed.
    assert score(ids, 0)["input_token_logprobs"] == got


@case
def prompt_logprobs_near_llama_cpp_on_the_f32_export():
    from test_llamacpp_parity import f32_copy, llama_logits
    f32 = f32_copy()
    ids = ids_of(PROMPT + " in the fifteenth century, when Johannes Gutenberg combined movable type")
    got = score(ids, 1, model=f32)["input_token_logprobs"]
    ref = log_softmax(llama_logits(ids, kind="f32"))
    want = np.array([ref[p - 1, ids[p]] for p in range(1, len(ids))])
    err = np.max(np.abs(np.array([t[0] for t in got]) - want))
    print(f"# prompt log-probs vs llama.cpp (F32 export): max |diff| {err:.2e} nats over {len(want)} tokens")
    assert err <= 2e-3, err


@case
def slime_opd_call_and_refusals():
    ids = ids_of(PROMPT)
    # slime's on-policy distillation: the teacher scores the whole sequence, generating nothing.
    st, doc = post("/generate", {"input_ids": ids, "return_logprob": True, "logprob_start_len": 0,
                                 "return_text_in_logprobs": True, "sampling_params": {"max_new_tokens": 0,
                                                                                      "temperature": 0}})
    assert st == 200, doc
    mi = doc["meta_info"]
    assert len(mi["input_token_logprobs"]) == len(ids) and mi["input_token_logprobs"][0][0] is None, mi
    assert all(isinstance(t[0], float) and t[0] <= 0 and isinstance(t[2], str)
               for t in mi["input_token_logprobs"][1:]), mi
    assert mi["output_token_logprobs"] == [] and doc["output_ids"] == [], doc
    # From a later position: only those positions.
    assert len(score(ids, 4)["input_token_logprobs"]) == len(ids) - 4
    for body, word in (
            ({"input_ids": ids, "sampling_params": {"max_new_tokens": 0}}, "max_new_tokens"),
            ({"input_ids": ids, "return_logprob": True, "logprob_start_len": len(ids) + 1,
              "sampling_params": {"max_new_tokens": 0}}, "logprob_start_len"),
            ({"input_ids": ids, "return_logprob": True, "logprob_start_len": 0,
              "sampling_params": {"max_new_tokens": 0, "n": 2}}, "n")):
        st, doc = post("/generate", body)
        assert st == 400 and word in doc["detail"], (body, st, doc)


@case
def token_ids_logprob_on_generate():
    """SGLang's token_ids_logprob: the asked ids' raw log-probs at every output token and scored prompt position,
    with the bits the same id has as the sampled token or an alternative, and near log_softmax of
    build/rollout-logits' rows; one list for all prompts or one per prompt."""
    ids = ids_of(PROMPT)
    want = [ids[3], 13, 0, 1000]
    st, doc = post("/generate", {"input_ids": ids, "return_logprob": True, "logprob_start_len": 0,
                                 "top_logprobs_num": 3, "token_ids_logprob": want,
                                 "sampling_params": {"max_new_tokens": 12, "temperature": 1.0, "sampling_seed": 8,
                                                     "ignore_eos": True}})
    assert st == 200, doc
    mi = doc["meta_info"]
    outs = mi["output_token_ids_logprobs"]
    assert len(outs) == len(doc["output_ids"]) and all([t[1] for t in o] == want for o in outs), outs
    hits = 0
    for o, tok, tops in zip(outs, mi["output_token_logprobs"], mi["output_top_logprobs"]):
        for lp, i, _ in o:
            if i == tok[1]:
                assert np.float32(lp) == np.float32(tok[0]), (lp, tok)
                hits += 1
            for alt in tops:
                if alt[1] == i:
                    assert np.float32(lp) == np.float32(alt[0]), (lp, alt)
                    hits += 1
    assert hits > 0, "no asked id was drawn or listed: the bit check saw nothing"
    ins = mi["input_token_ids_logprobs"]
    assert len(ins) == len(ids) and ins[0] is None, ins[:2]
    ref = log_softmax(raw_logits(ids))
    err = max(abs(lp - ref[p - 1, i]) for p in range(1, len(ids)) for lp, i, _ in ins[p])
    assert err <= 1e-5, err
    # the prompt token's own entry equals input_token_logprobs' (position 4 asks ids[3]: check position 3)
    assert np.float32(ins[3][0][0]) == np.float32(mi["input_token_logprobs"][3][0])
    print(f"# token_ids_logprob: {hits} equal-bit matches with sampled tokens and alternatives; max |diff| "
          f"{err:.1e} against log_softmax")
    # one list per prompt in a batch
    st, docs = post("/generate", {"input_ids": [ids, ids[:5]], "return_logprob": True,
                                  "token_ids_logprob": [[1, 2], [3]], "sampling_params": {"max_new_tokens": 2}})
    assert st == 200 and [[t[1] for t in d["meta_info"]["output_token_ids_logprobs"][0]] for d in docs] == \
        [[1, 2], [3]], docs
    for body, word in (({"token_ids_logprob": list(range(33))}, "token_ids_logprob"),
                       ({"token_ids_logprob": [10 ** 7]}, "token_ids_logprob"),
                       ({"token_ids_logprob": [[1], [2]]}, "token_ids_logprob"),
                       ({"token_ids_logprob": [1], "stream": True}, "token_ids_logprob")):
        st, doc = post("/generate", {"input_ids": ids, "return_logprob": True, **body,
                                     "sampling_params": {"max_new_tokens": 2}})
        assert st == 400 and word in str(doc), (body, st, doc)


@case
def daemons_exit_cleanly():
    stop_cleanly(*_d.values())


if __name__ == "__main__":
    main()
