"""Each RL framework's default generation request, as its own code builds it, against a real
build/rolloutd (the default model): answered 200, with the fields that framework reads.

The bodies are kept as data below, each beside the source file that builds it (names as of the
frameworks' 2026 code; shared/reference/rl-requests-2026.md §1 lists them). What each framework
reads back is checked as it reads it: slime and AReaL take meta_info.output_token_logprobs items
[logprob, token id, ...] and meta_info.finish_reason.type; SkyRL, prime-rl and OpenRLHF (vLLM
names) take choices[].token_ids, their logprobs and finish_reason; TRL takes choices[].token_ids and
logprobs.token_logprobs from /v1/completions. One behaviour per framework is checked too: slime's
no_stop_trim keeps the stop token's text, AReaL's frequency_penalty and SkyRL's min_tokens act, and
an RL recipe's stop "</answer>" with include_stop_str_in_output ends the text with the tag.
The daemon ends with SIGTERM and must exit 0."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import MODEL, case, main  # noqa: E402

from rdtest import Daemon, stop_cleanly  # noqa: E402

SERVED = "HuggingFaceTB/SmolLM2-135M-Instruct"   # --served-model-name: the HF name prime-rl checks for
MESSAGES = [{"role": "user", "content": "What is 12 + 7? Put the answer in <answer></answer> tags."}]
_d = []


def daemon():
    if not _d:
        _d.append(Daemon("--served-model-name", SERVED, model=MODEL))
    return _d[0]


def post(path, obj, timeout=120):
    return daemon().post(path, obj, timeout)


_ids = []


def prompt_ids():
    if not _ids:
        st, doc = post("/tokenize", {"messages": MESSAGES})
        assert st == 200, doc
        _ids.extend(doc["tokens"])
    return list(_ids)


def eos_id():
    st, _, body = daemon().http("/get_model_info")
    assert st == 200, body
    return json.loads(body)["eos_token_id"]


# ---- the bodies, as each framework builds them ----

def slime_body(ids):
    # slime/rollout/sglang_rollout.py: GenerateState.sampling_params and generate()'s payload
    # (rollout_top_p 1.0, its default, so no custom_params; sampling_seed under deterministic inference).
    return {"input_ids": ids, "return_logprob": True, "sampling_params": {
        "temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 32, "stop": None,
        "stop_token_ids": None, "skip_special_tokens": False, "no_stop_trim": True,
        "spaces_between_special_tokens": False, "sampling_seed": 1234}}


def areal_body(ids):
    # areal/engine/sglang_remote.py: the /generate payload (frequency_penalty and ignore_eos always sent).
    return {"input_ids": ids, "return_logprob": True, "stream": False, "sampling_params": {
        "top_p": 1.0, "top_k": 100000000, "max_new_tokens": 32, "temperature": 1.0,
        "stop_token_ids": [eos_id()], "frequency_penalty": 0.0, "ignore_eos": False, "sampling_seed": 5}}


def skyrl_body(ids):
    # skyrl/backends/skyrl_train/inference_servers/engine_utils.py: vLLM sampling params it adds to
    # every request (min_tokens, include_stop_str_in_output, skip_special_tokens), sent to
    # /inference/v1/generate.
    return {"token_ids": ids, "sampling_params": {
        "temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 32, "min_tokens": 1,
        "include_stop_str_in_output": True, "skip_special_tokens": True, "logprobs": 0, "seed": 9}}


def prime_body(ids):
    # src/prime_rl/configs/orchestrator.py: sampling defaults (top_k -1, min_p 0) and return_token_ids,
    # on the chat route with the top-level cache_salt it adds.
    return {"model": SERVED, "messages": MESSAGES, "max_tokens": 32, "temperature": 1.0, "top_p": 1.0,
            "top_k": -1, "min_p": 0.0, "seed": 3, "logprobs": True, "return_token_ids": True,
            "cache_salt": "run-1"}


def openrlhf_body(ids):
    # openrlhf/trainer/ppo_utils/samples_generator.py: SamplingParams(temperature, top_p, top_k,
    # max_tokens, min_tokens=1, skip_special_tokens, include_stop_str_in_output=True, logprobs=...).
    return {"token_ids": ids, "sampling_params": {
        "temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 32, "min_tokens": 1,
        "skip_special_tokens": False, "include_stop_str_in_output": True, "logprobs": 0, "n": 2, "seed": 4}}


def trl_body(ids):
    # trl/trainer/grpo_config.py + its vLLM client: token prompts on /v1/completions with
    # repetition_penalty, min_p, top_k, n and logprobs 0, return_token_ids.
    return {"prompt": ids, "n": 2, "max_tokens": 32, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
            "min_p": 0.0, "repetition_penalty": 1.0, "logprobs": 0, "return_token_ids": True, "seed": 8}


def check_sglang(doc):
    docs = doc if isinstance(doc, list) else [doc]
    for d in docs:
        lps = d["meta_info"]["output_token_logprobs"]
        assert [x[1] for x in lps] == d["output_ids"] and all(isinstance(x[0], float) for x in lps), d
        assert d["meta_info"]["finish_reason"]["type"] in ("stop", "length"), d
        assert isinstance(d["text"], str)
    return docs


def check_generate_tokens(doc):
    for c in doc["choices"]:
        assert c["token_ids"] and c["finish_reason"] in ("stop", "length"), c
        assert len(c["logprobs"]["content"]) == len(c["token_ids"]), c
    return doc["choices"]


@case
def slime_default_request():
    st, doc = post("/generate", slime_body(prompt_ids()))
    assert st == 200, doc
    (d,) = check_sglang(doc)
    # no_stop_trim: a sample that ends at EOS keeps the EOS token's text (skip_special_tokens false).
    if d["meta_info"]["finish_reason"]["type"] == "stop":
        st, full = post("/detokenize", {"tokens": d["output_ids"]})
        assert d["text"] == full["prompt"], (d["text"], full)


@case
def areal_default_request():
    body = areal_body(prompt_ids())
    st, doc = post("/generate", body)
    assert st == 200, doc
    check_sglang(doc)
    # AReaL's frequency_penalty acts when it is not 0.
    body["sampling_params"].update(temperature=0, frequency_penalty=2.0)
    st, pen = post("/generate", body)
    body["sampling_params"]["frequency_penalty"] = 0.0
    st0, plain = post("/generate", body)
    assert st == st0 == 200 and pen["output_ids"] != plain["output_ids"], (pen, plain)


@case
def skyrl_default_request():
    st, doc = post("/inference/v1/generate", skyrl_body(prompt_ids()))
    assert st == 200, doc
    (c,) = check_generate_tokens(doc)
    assert len(c["token_ids"]) >= 1


@case
def prime_rl_default_request():
    # src/prime_rl/utils/client.py: at start-up /v1/models must list the HF model name as an id.
    st, _, models = daemon().http("/v1/models")
    assert st == 200 and SERVED in [m["id"] for m in json.loads(models)["data"]], models
    st, doc = post("/v1/chat/completions", prime_body(prompt_ids()))
    assert st == 200, doc
    c = doc["choices"][0]
    assert c["token_ids"] and c["logprobs"]["content"] and c["finish_reason"] in ("stop", "length"), c


@case
def openrlhf_default_request():
    st, doc = post("/inference/v1/generate", openrlhf_body(prompt_ids()))
    assert st == 200, doc
    assert len(check_generate_tokens(doc)) == 2


@case
def trl_async_grpo_default_request():
    st, doc = post("/v1/completions", trl_body(prompt_ids()))
    assert st == 200, doc
    assert len(doc["choices"]) == 2
    for c in doc["choices"]:
        assert len(c["token_ids"]) == len(c["logprobs"]["token_logprobs"]) >= 1, c


@case
def answer_tag_stop_is_kept_in_the_text():
    """RL recipes with think/answer tags: stop ["</answer>"] with include_stop_str_in_output."""
    body = {"messages": MESSAGES + [{"role": "assistant", "content": "<answer>19"}], "max_tokens": 40,
            "temperature": 0, "return_token_ids": True}
    # The model is steered to close the tag: a greedy continuation of an open answer.
    st, plain = post("/v1/chat/completions", {**body, "ignore_eos": True})
    assert st == 200, plain
    text = plain["choices"][0]["message"]["content"]
    if "</answer>" not in text:
        # This model does not close it greedily: a stop string it does write serves the same check.
        stop = text[len(text) // 2: len(text) // 2 + 4]
    else:
        stop = "</answer>"
    st, doc = post("/v1/chat/completions", {**body, "ignore_eos": True, "stop": [stop],
                                            "include_stop_str_in_output": True})
    assert st == 200 and doc["choices"][0]["finish_reason"] == "stop", doc
    assert doc["choices"][0]["message"]["content"].endswith(stop), (doc, stop)
    st, cut = post("/v1/chat/completions", {**body, "ignore_eos": True, "stop": [stop]})
    assert not cut["choices"][0]["message"]["content"].endswith(stop), cut


@case
def skyrl_min_tokens_holds_back_eos():
    ids = prompt_ids()
    st, short = post("/inference/v1/generate", {"token_ids": ids, "sampling_params": {
        "temperature": 0, "max_tokens": 64}})
    n = len(short["choices"][0]["token_ids"])
    assert short["choices"][0]["finish_reason"] == "stop" and n < 64, short
    st, doc = post("/inference/v1/generate", {"token_ids": ids, "sampling_params": {
        "temperature": 0, "max_tokens": 64, "min_tokens": n + 3}})
    assert st == 200 and len(doc["choices"][0]["token_ids"]) >= n + 3, doc


@case
def daemon_exits_cleanly():
    stop_cleanly(*_d)


if __name__ == "__main__":
    main()
