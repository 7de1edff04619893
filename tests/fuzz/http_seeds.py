#!/usr/bin/env python3
"""Seeds for build/fuzz/fuzz_http_json: valid request bodies of every route
reader it fuzzes, plus edge cases (deep nesting, huge arrays, bad UTF-8,
huge / negative / fractional numbers, wrong field types).

Each file is one input: its first byte picks the route (index into the
target's routes[] table, plus N_ROUTES * variant: variant bit 0 = no
tokenizer, bit 1 = a mixture-of-experts model's limits), the rest is the
body. Keep ROUTES in the order of routes[] in tests/fuzz/fuzz_http_json.c.

    python3 tests/fuzz/http_seeds.py SEEDS
"""
import json
import os
import sys

ROUTES = ["/generate", "/v1/completions", "/v1/chat/completions", "/abort_request", "/pause_generation",
          "/update_weights_from_disk", "/inference/v1/generate", "/pause?", "/sleep?", "/abort_requests", "/tokenize",
          "/detokenize", "/update_weights", "/release_memory_occupation", "model", "routed_experts", "/v1/loads?"]
# Routes whose input is the URL's query string, not a JSON body.
QUERY = {"/pause?", "/sleep?", "/v1/loads?"}
N = len(ROUTES)

# Valid bodies, by route.
VALID = {
    "/generate": [
        {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 8, "temperature": 0}},
        {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 4, "top_p": 0.9, "top_k": 20,
                                                        "min_p": 0.05, "n": 2, "seed": 7}},
        {"input_ids": [[1, 2], [3, 4, 5]], "rid": ["a", "b"], "return_logprob": True, "top_logprobs_num": 3},
        {"text": ["one", "two"], "stream": True, "rid": "r1",
         "sampling_params": {"stop": ["\n", "."], "stop_token_ids": [2], "ignore_eos": True,
                             "sampling_seed": 12345}},
        {"text": "x", "return_routed_experts": True, "sampling_params": {"stop": "END", "top_k": -1}},
        {"text": "<|im_start|>user\nhi<|im_end|>\n", "sampling_params": None, "rid": None},
        {"input_ids": [1, 2, 3], "sampling_params": {"repetition_penalty": 1.3, "frequency_penalty": -0.5,
                                                     "presence_penalty": 2, "min_new_tokens": 2, "max_new_tokens": 4,
                                                     "logit_bias": {"5": 3.5, "0": -100}, "no_stop_trim": True,
                                                     "skip_special_tokens": True,
                                                     "spaces_between_special_tokens": False}},
        {"input_ids": [1], "sampling_params": {"json_schema": "{}", "stream_interval": 2}, "lora_path": "a"},
        {"input_ids": [1], "sampling_params": {"logit_bias": {"x": 1, "99999999999": 1e300}, "colour": 1}},
        {"input_ids": [1, 2, 3], "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2,
         "sampling_params": {"max_new_tokens": 0}},
        {"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": 5, "sampling_params": {"max_new_tokens": 0,
                                                                                                "n": 2}},
        {"input_ids": [[1, 2], [3]], "return_logprob": True, "token_ids_logprob": [[1, 2], [0]],
         "logprob_start_len": 0},
        {"input_ids": [1, 2], "return_logprob": True, "token_ids_logprob": [5, 99999999, -1], "stream": True},
    ],
    "/v1/completions": [
        {"model": "m", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0.7, "seed": 1},
        {"prompt": [1, 2, 3], "n": 3, "logprobs": 2, "stream": True, "stream_options": {"include_usage": True}},
        {"prompt": [[1, 2], [3]], "stop": ["a"], "stop_token_ids": [0], "return_token_ids": True, "top_k": 5},
        {"prompt": ["a", "b", "c"], "echo": False, "ignore_eos": True, "min_p": 0.1, "top_p": 0.5},
        {"prompt": "p", "return_routed_experts": True, "max_tokens": 1},
        {"prompt": [1, 2], "repetition_penalty": 0.8, "frequency_penalty": 1, "min_tokens": 1, "max_tokens": 3,
         "logit_bias": {"2": -5}, "include_stop_str_in_output": True, "user": "u", "response_format": {"type": "text"}},
        {"prompt": "p", "response_format": {"type": "json_object"}, "best_of": 2, "allowed_token_ids": [1]},
        {"prompt": [[1, 2], [3]], "echo": True, "logprobs": 1, "max_tokens": 0, "prompt_logprobs": 3},
        {"prompt": "p", "echo": True, "stream": True, "prompt_logprobs": -1},
    ],
    "/v1/chat/completions": [
        {"model": "m", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                      {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}],
         "logprobs": True, "top_logprobs": 2, "max_completion_tokens": 4, "stream": True,
         "stream_options": {"include_usage": True}, "seed": 3},
        {"messages": [{"role": "developer", "content": [{"type": "text", "text": "a"},
                                                         {"type": "text", "text": "b"}]},
                      {"role": "user", "content": "c"}], "n": 2, "stop": "\n", "return_token_ids": True},
        {"messages": [{"role": "tool", "content": "x"}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]},
    ],
    "/abort_request": [
        {"rid": "r1"},
        {"abort_all": True},
        {"abort_all": False, "rid": "x"},
        {},
    ],
    "/pause_generation": [
        {"mode": "abort"}, {"mode": "wait"}, {"mode": "keep"}, {"mode": "in_place"}, {"mode": "retract"}, {},
        {"mode": "other"},
    ],
    "/update_weights_from_disk": [
        {"model_path": "/tmp/w.gguf"},
        {"model_path": "/tmp/hf", "version": 5, "mode": "drain"},
        {"model_path": "m.safetensors", "weight_version": "7", "abort_all_requests": True},
        {"model_path": "m.gguf", "weight_version": 9, "mode": "abort"},
        {"model_path": "m.gguf", "weight_version": "99999999999999999999"},
        {"model_path": "m.gguf", "version": 4611686018427387904},
        {"model_path": "", "mode": "continue"},
    ],
    "/inference/v1/generate": [
        {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 8, "temperature": 1.0, "logprobs": 0}},
        {"token_ids": [5], "sampling_params": {"max_tokens": 2, "logprobs": 3, "top_k": 5, "seed": 11, "n": 2},
         "stream": True, "stream_options": {"include_usage": True}, "request_id": "req-1"},
        {"token_ids": [1, 2], "sampling_params": {"repetition_penalty": 1, "min_tokens": 0, "logit_bias": {}}},
        {"token_ids": [1], "sampling_params": {"presence_penalty": 0.5, "min_tokens": 1, "max_tokens": 2,
                                                "include_stop_str_in_output": True, "detokenize": False,
                                                "logit_bias": {"3": 1.5}, "bad_words": ["x"]}},
        {"token_ids": [1], "sampling_params": {}, "priority": 3},
        {"token_ids": [], "sampling_params": {}},
        {"token_ids": [1], "sampling_params": {"stop": ["x"], "stop_token_ids": [2]}, "features": {}},
    ],
    "/abort_requests": [
        {"request_ids": ["a", "b"]}, {"request_ids": []}, {}, {"request_ids": "a"}, {"request_ids": ["a", 1]},
    ],
    "/tokenize": [
        {"prompt": "Hello world"},
        {"prompt": "Hi", "add_special_tokens": False, "return_token_strs": True},
        {"messages": [{"role": "user", "content": "Hello"}]},
        {"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": False},
        {"messages": [{"role": "user", "content": "x"}], "tools": []},
        {"prompt": "a", "messages": []},
    ],
    "/detokenize": [
        {"tokens": [1, 2, 3]}, {"tokens": []}, {"tokens": [49151, 0]}, {"tokens": [49152]}, {"tokens": [1.5]},
        {"tokens": list(range(200, 260))},
    ],
    "/update_weights": [
        {"update_info": {"path": "/tmp/w"}},
        {"update_info": {"path": "/tmp/w", "weight_version": "3"}},
        {"weight_dir": "/tmp/step_5", "weight_version": 5},
        {"update_info": {"names": ["a"], "dtype_names": ["bf16"], "shapes": [[2]]}},
        {"init_info": {}},
        {"init_info": {"master_address": "h", "master_port": 1, "rank_offset": 1, "world_size": 2}},
        {"update_info": {"path": "x" * 600}},
    ],
    "/release_memory_occupation": [
        {"tags": ["weights"]}, {"tags": ["kv_cache", "cuda_graph"]}, {"tags": None}, {}, {"tags": ["other"]},
        {"tags": "weights"},
    ],
    # the model a /v1 call names (the target serves "served/name", "tiny-qwen2" and its path)
    "model": [
        {"model": "served/name", "prompt": "x"}, {"model": "tiny-qwen2"}, {"model": "build/testdata/tiny-qwen2.gguf"},
        {"model": "other"}, {"model": ""}, {"model": None}, {}, {"model": "x" * 700}, {"model": "\u00e9\u4e2d"},
    ],
    "routed_experts": [
        {"return_routed_experts": True, "sampling_params": {"routed_experts_prompt_start": 3}},
        {"return_routed_experts": False}, {"sampling_params": {"routed_experts_prompt_start": 0}},
        {"sampling_params": {"routed_experts_prompt_start": -1}}, {"sampling_params": "x"},
        {"sampling_params": {"routed_experts_prompt_start": 2 ** 40}},
    ],
}

# Query strings, for the routes that read one.
QUERIES = {
    "/pause?": ["", "mode=abort", "mode=wait", "mode=keep&clear_cache=false", "mode=other", "clear_cache=maybe",
                "wait_for_inflight_requests=true", "mode=%6Beep", "mode=%", "mode=%zz", "mode=" + "a" * 40,
                "reset_running_requests=1&reset_external=no", "mode&clear_cache", "&&&mode=wait&",
                "clear_cache=%FF", "mode=ke+ep"],
    "/sleep?": ["", "level=1", "level=2&mode=abort", "level=3", "mode=wait", "mode=x", "tags=weights",
                "tags=kv_cache&tags=weights", "tags=gpu", "level=" + "9" * 100, "=&=&", "tags"],
    "/v1/loads?": ["", "include=core", "include=core,memory,spec,lora,disagg,queues", "include=all",
                   "include=%20core%20,%20queues", "include=bogus", "include=,", "include=" + "c" * 300,
                   "dp_rank=0", "dp_rank=1", "dp_rank=", "format=prometheus", "format=json&include=memory",
                   "format=" + "p" * 300],
}

# Values to put in any field: every JSON type, edges of the bounds, huge and negative numbers.
ODD = [None, True, False, 0, -1, 1, 0.5, -0.0, 1e308, -1e308, 1e999, -1e999, 2 ** 31, 2 ** 53, 2 ** 53 - 1,
       2 ** 62, 2 ** 63, 2 ** 64, 1 << 30, (1 << 30) + 1, 1 << 20, (1 << 20) + 1, 1.5, "", "x", "1", [], [1], {},
       {"a": 1}, [[]], [None], ["a", 1]]

# Fields each route reads (so the odd values land where a reader looks).
FIELDS = {
    "/generate": ["text", "input_ids", "sampling_params", "return_logprob", "return_routed_experts",
                  "top_logprobs_num", "stream", "rid", "logprob_start_len", "token_ids_logprob"],
    "/v1/completions": ["prompt", "max_tokens", "logprobs", "temperature", "top_p", "top_k", "min_p", "n", "seed",
                        "stop", "stop_token_ids", "ignore_eos", "stream", "stream_options", "echo",
                        "return_token_ids", "return_routed_experts"],
    "/v1/chat/completions": ["messages", "max_completion_tokens", "max_tokens", "logprobs", "top_logprobs",
                             "temperature", "n", "stop", "stream_options"],
    "/abort_request": ["rid", "abort_all"],
    "/pause_generation": ["mode"],
    "/update_weights_from_disk": ["model_path", "version", "weight_version", "mode", "abort_all_requests"],
    "/inference/v1/generate": ["token_ids", "sampling_params", "stream", "stream_options", "request_id",
                               "priority"],
    "/abort_requests": ["request_ids"],
    "/tokenize": ["prompt", "messages", "add_special_tokens", "return_token_strs", "add_generation_prompt"],
    "/detokenize": ["tokens"],
    "/update_weights": ["update_info", "weight_dir", "weight_version", "init_info"],
    "/release_memory_occupation": ["tags"],
    "model": ["model"],
    "routed_experts": ["return_routed_experts", "sampling_params"],
}
SAMPLING = ["max_new_tokens", "temperature", "top_p", "top_k", "min_p", "n", "seed", "sampling_seed",
            "ignore_eos", "stop", "stop_token_ids"]


def dump(obj):
    # Python writes an infinite float as Infinity, which is not JSON; a number past the double range is.
    s = json.dumps(obj, separators=(",", ":")).replace("-Infinity", "-1e999").replace("Infinity", "1e999")
    return s.encode()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "SEEDS"
    os.makedirs(out, exist_ok=True)
    seeds = []

    def add(route, body, variant=0):
        seeds.append(bytes([ROUTES.index(route) + N * variant]) + body)

    for route, queries in QUERIES.items():
        for q in queries:
            for variant in (0, 1, 2):
                add(route, q.encode(), variant)
    for x in (b"\xff", b"\xc3", b"\x00", b"%00"):
        add("/pause?", b"mode=" + x)
        add("/sleep?", b"level=" + x + b"&tags=" + x)
    for route, bodies in VALID.items():
        for b in bodies:
            for variant in (0, 1, 2):
                add(route, dump(b), variant)
        base = bodies[0]
        for field in FIELDS[route]:
            for v in ODD:
                b = dict(base)
                b[field] = v
                add(route, dump(b))
    tgen = VALID["/inference/v1/generate"][1]
    for field in ["max_tokens", "temperature", "top_p", "top_k", "min_p", "n", "seed", "logprobs", "stop",
                  "stop_token_ids", "ignore_eos", "repetition_penalty", "prompt_logprobs", "min_tokens"]:
        for v in ODD:
            b = json.loads(json.dumps(tgen))
            b["sampling_params"][field] = v
            add("/inference/v1/generate", dump(b))
    gen = VALID["/generate"][1]
    for field in SAMPLING:
        for v in ODD:
            b = json.loads(json.dumps(gen))
            b["sampling_params"][field] = v
            add("/generate", dump(b))

    # Bounds that admission checks: stop lists at and past STOP_MAX_STRS, long stop strings, token ids at the vocab.
    for k in (4, 5, 8, 9, 16, 17):
        add("/v1/completions", dump({"prompt": "a", "stop": ["s%d" % i for i in range(k)]}))
        add("/v1/completions", dump({"prompt": [1], "stop_token_ids": list(range(k))}))
    for n in (63, 64, 65, 256, 257):
        add("/v1/completions", dump({"prompt": "a", "stop": "x" * n}))
        add("/v1/completions", dump({"prompt": [1], "max_tokens": n, "n": n // 4}))
    for tid in (49151, 49152, 2 ** 31 - 1, 2 ** 31, -1):
        add("/generate", dump({"input_ids": [tid]}))
        add("/v1/completions", dump({"prompt": [[1], [tid]]}))

    # Deep nesting (cJSON's limit is 1000), in every route.
    for route in [r for r in ROUTES if r not in QUERY]:
        for depth in (10, 999, 1000, 1001, 2040):
            add(route, b"{\"a\":" + b"[" * depth + b"]" * depth + b"}")
    add("/generate", b"{\"input_ids\":" + b"[" * 50 + b"1" + b"]" * 50 + b"}")
    add("/v1/chat/completions", dump({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 100}]}))

    # Huge arrays.
    # (inputs are cut at -max_len=4096 bytes: these fit)
    add("/generate", dump({"input_ids": [7] * 1500}))
    add("/generate", dump({"input_ids": list(range(49000, 49700))}))
    add("/generate", dump({"input_ids": [[1]] * 600}))
    add("/v1/completions", dump({"prompt": ["a"] * 600}))
    add("/v1/completions", dump({"prompt": [1], "stop_token_ids": [1] * 1500}))
    add("/v1/chat/completions", dump({"messages": [{}] * 1025}))
    add("/v1/chat/completions", dump({"messages": [{"role": "user", "content": "a"}] * 130}))
    add("/generate", dump({"input_ids": [[1, 2], [3]], "rid": ["a"] * 300}))

    # Bad UTF-8, in strings and outside them.
    bad = [b"\xff", b"\xc3", b"\xc3\x28", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf",
           b"\xf0\x9f\x98"]
    for x in bad:
        add("/generate", b"{\"text\":\"a" + x + b"b\"}")
        add("/v1/completions", b"{\"prompt\":\"" + x + b"\",\"stop\":\"" + x + b"\"}")
        add("/v1/chat/completions", b"{\"messages\":[{\"role\":\"" + x * 50 + b"\",\"content\":\"c\"}]}")
        add("/v1/chat/completions", b"{\"messages\":[{\"role\":\"user\",\"content\":\"" + x + b"\"}]}")
        add("/abort_request", b"{\"rid\":\"" + x + b"\"}")
        add("/update_weights_from_disk", b"{\"model_path\":\"m\",\"weight_version\":\"" + x + b"\"}")
        add("/pause_generation", b"{\"mode\":\"" + x + b"\"}")
    add("/generate", dump({"text": "\ud83d\ude00 \u00e9 \u4e2d"}))
    add("/generate", b"{\"text\":\"\\ud800\"}")
    add("/generate", b"{\"text\":\"a\\u0000b\"}")

    # Not JSON, not an object, duplicate keys, an empty body.
    for route in [r for r in ROUTES if r not in QUERY]:
        for body in (b"", b"[]", b"1", b"\"s\"", b"null", b"{", b"{\"a\":}", b"{}", b"{} x",
                     b"{\"text\":\"a\",\"text\":1}"):
            add(route, body)

    for i, s in enumerate(seeds):
        with open(os.path.join(out, "seed-%04d" % i), "wb") as f:
            f.write(s)
    print("%d seeds in %s" % (len(seeds), out))


if __name__ == "__main__":
    main()
