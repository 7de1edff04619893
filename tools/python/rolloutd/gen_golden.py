"""Writes the protocol's golden vectors: proto/testdata/*.bin and vectors.json.

    python3 tools/python/rolloutd/gen_golden.py [--out proto/testdata]

Valid frames are encoded by the Python codec; vectors.json gives each file's
protocol version and decoded fields in the JSON form of proto.to_json (and,
for SUBMITs, the codes check_request gives against the limits of
check_limits, the file's own or the document's). Invalid frames are built
byte by byte, each with the error code a decoder must return. The C test
(tests/unit/test_proto.c) and the Python test (tests/py/test_proto.py) both
check every vector. Deterministic: a second run writes identical files.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rolloutd import proto as P  # noqa: E402
from rolloutd.crc32c import crc32c  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

LIMITS = P.HelloOk(
    client_id=0x0123456789ABCDEF, version=1, flags=P.HELLO_OK_TEXT | P.HELLO_OK_CHAT, features=0,
    weight_version=7, vocab_size=49152, max_context=8192, n_layers=30, dim=576, n_heads=9, n_kv_heads=3,
    eos_id=2, max_prompt_tokens=4096, max_message_bytes=64 << 20, max_n=64, max_requests_per_submit=1024,
    max_tokens=8192, max_stop_ids=16, max_logprobs_topk=20, retention_results=65536, retention_bytes=1 << 30,
    max_wait_ms=30000, client_ttl_s=600, pending_results=0, inflight_samples=0,
    model_name="SmolLM2-135M-Instruct", architecture="llama", backend="cpu", server="rolloutd 0.1.0")

# A mixture-of-experts daemon that chose version 2 (routing replay) for a client offering 1..2.
LIMITS_V2 = P.HelloOk(**{k: getattr(LIMITS, k) for k in LIMITS.__dataclass_fields__})
LIMITS_V2.version = 2
LIMITS_V2.features = P.FEATURE_WEIGHT_UPDATE | P.FEATURE_RELAY | P.FEATURE_ROUTES
LIMITS_V2.vocab_size, LIMITS_V2.n_layers, LIMITS_V2.dim, LIMITS_V2.n_heads, LIMITS_V2.n_kv_heads = 151936, 48, 2048, 32, 4
LIMITS_V2.model_name, LIMITS_V2.architecture = "Qwen3-30B-A3B", "qwen3moe"

# The dense daemon of LIMITS that chose version 3, and version 4 (the sampling tail), for clients offering them.
LIMITS_V3 = P.HelloOk(**{k: getattr(LIMITS, k) for k in LIMITS.__dataclass_fields__})
LIMITS_V3.version = 3
LIMITS_V4 = P.HelloOk(**{k: getattr(LIMITS, k) for k in LIMITS.__dataclass_fields__})
LIMITS_V4.version = 4
# ... and version 5 (prompt scoring).
LIMITS_V5 = P.HelloOk(**{k: getattr(LIMITS, k) for k in LIMITS.__dataclass_fields__})
LIMITS_V5.version = 5
# ... and version 6 (LoRA adapters).
LIMITS_V6 = P.HelloOk(**{k: getattr(LIMITS, k) for k in LIMITS.__dataclass_fields__})
LIMITS_V6.version = 6


def req(rid, prompt=None, text=None, bias=None, **kw):
    q = P.Request(client_req_id=rid, **kw)
    if text is not None:
        q.flags |= P.REQ_PROMPT_IS_TEXT
        q.prompt_text = text
    else:
        q.prompt_ids = np.array(prompt, dtype="<i4")
    q.stop_ids = np.array(kw.get("stop_ids", []), dtype="<i4")
    if bias is not None:        # logit_bias as (id, bias) pairs, in wire order
        q.bias_ids = np.array([i for i, _ in bias], dtype="<i4")
        q.bias_vals = np.array([b for _, b in bias], dtype="<f4")
    return q


def sampled(rid, prompt=None, **kw):
    """A request with the sampling tail (version 4, flag REQ_SAMPLING)."""
    q = req(rid, prompt, **kw)
    q.flags |= P.REQ_SAMPLING
    return q


def scored(rid, prompt=None, score_from=0, **kw):
    """A request that scores its prompt (version 5, flag REQ_SCORE)."""
    q = req(rid, prompt, **kw)
    q.flags |= P.REQ_SCORE
    q.score_from = score_from
    return q


def adapted(rid, prompt=None, lora="math-v1", **kw):
    """A request whose samples run under a LoRA adapter (version 6, flag REQ_LORA)."""
    q = req(rid, prompt, **kw)
    q.flags |= P.REQ_LORA
    q.lora = lora
    return q


def with_lora(x, name, version):
    """x produced under adapter name at its version (version 6, RESULT_LORA)."""
    x.flags |= P.RESULT_LORA
    x.lora, x.lora_version = name, version
    return x


def with_scores(x, score_from, n_scored=None, seed=0):
    """x with the prompt's scores (version 5, RESULT_SCORES) from score_from on: few-bit log-probs, NaN at
    position 0 and its alternatives padded there (-1 / -inf), as the daemon sends them."""
    rng = np.random.default_rng(1000 + x.seq + seed)
    n = x.n_prompt - score_from if n_scored is None else n_scored
    x.flags |= P.RESULT_SCORES
    x.score_from = score_from
    x.prompt_logprobs = (-rng.integers(0, 4096, n) / 256.0).astype("<f4")
    x.prompt_top_ids = rng.integers(0, 49152, (n, x.top_k)).astype("<i4")
    x.prompt_top_logprobs = np.sort(-rng.integers(0, 4096, (n, x.top_k)) / 128.0, axis=1)[:, ::-1].astype("<f4")
    if score_from == 0 and n:
        x.prompt_logprobs[0] = np.nan
        x.prompt_top_ids[0] = -1
        x.prompt_top_logprobs[0] = -np.inf
    return x


def result(seq, rid, n_tokens, spans, top_k=0, processed=False, finish=P.FINISH_STOP, **kw):
    rng = np.random.default_rng(seq)
    x = P.Result(seq=seq, client_req_id=rid, finish=finish, top_k=top_k, **kw)
    # log-probs with few mantissa bits, so the JSON text is short and exact
    x.token_ids = rng.integers(0, 49152, n_tokens).astype("<i4")
    x.logprobs = (-rng.integers(0, 4096, n_tokens) / 256.0).astype("<f4")
    if processed:
        x.flags |= P.RESULT_PROCESSED
        x.logprobs_processed = (-rng.integers(0, 4096, n_tokens) / 512.0).astype("<f4")
    x.top_ids = rng.integers(0, 49152, (n_tokens, top_k)).astype("<i4")
    x.top_logprobs = np.sort(-rng.integers(0, 4096, (n_tokens, top_k)) / 128.0, axis=1)[:, ::-1].astype("<f4")
    x.spans = spans
    return x


def routes(rng, n_routes, layers, k, n_experts):
    """Distinct expert ids per (position, layer), as a router's top-k are, in the wire's dtype."""
    ids = np.array([[rng.choice(n_experts, k, replace=False) for _ in range(layers)] for _ in range(n_routes)])
    return ids.reshape(n_routes, layers, k).astype(P.ROUTE_DTYPES[P.route_width(n_experts)])


def valid_vectors():
    V = []

    def add(name, msg, desc, total=False, **extra):
        if total:
            msg.total_bytes = sum(t.nbytes for t in msg.tensors)
        V.append((name, msg, desc, extra))

    add("hello_new", P.Hello(client_id=0, client_name="trainer-0"), "a new client: client_id 0")
    add("hello_resume_unicode", P.Hello(client_id=0xDEADBEEFCAFEF00D, min_version=1, max_version=3,
                                        client_name="learner-π-学习-🚀"),
        "a reconnecting client presenting its id; a version range; a non-ASCII name")
    add("hello_ok", LIMITS, "the daemon's reply: model, limits, text and chat flags")
    resumed = P.HelloOk(**{k: getattr(LIMITS, k) for k in LIMITS.__dataclass_fields__})
    resumed.flags |= P.HELLO_OK_RESUMED
    resumed.pending_results, resumed.inflight_samples, resumed.weight_version = 3, 12, 2 ** 64 - 1
    resumed.backend, resumed.eos_id = "cuda", -1
    add("hello_ok_resumed", resumed, "a resumed client with results pending; eos_id -1; max u64 version")

    add("submit_tokens", P.Submit(client_id=0x0123456789ABCDEF, requests=[
        req(1, [1, 9690, 314, 253], n=8, max_tokens=256, temperature=0.75, top_p=0.875, top_k=50, min_p=0.0625,
            seed=1234, logprobs_topk=5, flags=P.REQ_HAS_SEED | P.REQ_PROCESSED_LOGPROBS, stop_ids=[2, 0]),
        req(2, [5], n=1, max_tokens=1, temperature=0.0, flags=P.REQ_IGNORE_EOS),
    ]), "two token-id requests: seed, processed log-probs, top-k, stop ids; greedy with ignore_eos",
        check=[0, 0])
    add("submit_text", P.Submit(client_id=42, requests=[
        req(2 ** 64 - 1, text="What is 7 × 8? Answer in 中文 ✓ 🚀", n=4, max_tokens=64, temperature=1.0,
            flags=P.REQ_CHAT_TEMPLATE, seed=2 ** 64 - 1),
    ]), "a UTF-8 text prompt through the chat template; max u64 client_req_id and seed (no has_seed flag)",
        check=[0])
    add("submit_empty", P.Submit(client_id=42, requests=[]), "a SUBMIT with no requests", check=[])
    add("submit_invalid_params", P.Submit(client_id=42, requests=[
        req(10, [1, 2, 3], n=0),
        req(11, [1, 2, 3], max_tokens=8190),
        req(12, [1, 49152, 3]),
        req(13, [1, 2, 3], temperature=math.nan),
        req(14, [1, 2, 3], top_p=0.0),
        req(15, [1, 2, 3], flags=0x20),
        req(16, [1, 2, 3], flags=P.REQ_CHAT_TEMPLATE),
        req(17, [1, 2, 3], stop_ids=list(range(17))),
        req(18, [], max_tokens=4),
        req(19, [1, 2, 3], top_k=-1),
        req(20, [1, 2, 3], min_p=1.5),
        req(21, [1, 2, 3], logprobs_topk=21),
        req(22, [1, 2, 3], temperature=math.inf),
        req(23, [-1, 2, 3]),
        req(24, text="", max_tokens=4),
        req(25, [1, 2, 3], n=64, max_tokens=4096, temperature=2.0, top_p=1.0),
    ]), "well-formed requests that proto_check_request refuses against hello_ok's limits (all but the last)",
        check=[7] * 15 + [0])

    add("submit_ok", P.SubmitOk(items=[
        P.SubmitItem(client_req_id=1, status=0),
        P.SubmitItem(client_req_id=2, status=0, flags=P.SUBMIT_DUPLICATE),
        P.SubmitItem(client_req_id=3, status=P.E.INVALID_PARAMS,
                     message="request 3: n = 0; expected 1..64"),
        P.SubmitItem(client_req_id=4, status=P.E.BUSY,
                     message="client retention full (65536 results); fetch and ack, then retry"),
    ]), "accepted, accepted as a duplicate, invalid, busy")
    add("submit_ok_empty", P.SubmitOk(items=[]), "the reply to an empty SUBMIT")
    add("fetch", P.Fetch(client_id=0x0123456789ABCDEF, ack_seq=41, max_results=256, wait_ms=1000,
                         max_bytes=8 << 20), "a long-poll acking everything up to seq 41")
    add("fetch_ack_only", P.Fetch(client_id=7, ack_seq=2 ** 64 - 1, max_results=0, wait_ms=0, max_bytes=0),
        "max_results 0: acknowledge only")

    add("results_empty", P.Results(ack_seq=41, pending_results=0, inflight_samples=5),
        "a long-poll that timed out: no results, 5 samples still running")
    add("results_basic", P.Results(ack_seq=41, pending_results=2, inflight_samples=3, results=[
        result(42, 1, 6, [(0, 6, 7)], sample_idx=0, n_prompt=4, seed=1234, version_admit=7, version_finish=7,
               queued_us=150, first_token_us=2100, total_us=9800),
        result(43, 1, 4, [(0, 4, 7)], sample_idx=1, finish=P.FINISH_LENGTH, n_prompt=4, seed=1234,
               version_admit=7, version_finish=7, queued_us=151, first_token_us=2200, total_us=7000),
    ]), "two samples of one request: raw log-probs only, one span each")
    add("results_topk", P.Results(ack_seq=43, pending_results=0, inflight_samples=0, results=[
        result(44, 2, 5, [(0, 2, 7), (2, 5, 8)], top_k=3, processed=True, sample_idx=3, n_preempt=2,
               n_prompt=17, seed=99, version_admit=7, version_finish=8, queued_us=10, first_token_us=300,
               total_us=4000),
    ]), "processed log-probs, top-3 alternatives, a weight update mid-sequence (two spans), 2 preemptions")
    padded = result(45, 2, 2, [(0, 2, 8)], top_k=4, processed=True, sample_idx=0, n_prompt=3, seed=5,
                    version_admit=8, version_finish=8, queued_us=1, first_token_us=2, total_us=3)
    padded.top_ids = np.array([[17, 3, -1, -1], [4, 9, 11, -1]], dtype="<i4")
    padded.top_logprobs = np.array([[-0.25, -1.5, -np.inf, -np.inf], [-0.5, -0.75, -3.0, -np.inf]], dtype="<f4")
    padded.logprobs_processed = np.array([0.0, np.nan], dtype="<f4")
    add("results_topk_padded", P.Results(ack_seq=44, results=[padded]),
        "top-k rows padded with -1 / -inf; a NaN and a 0 processed log-prob")
    add("results_abort_empty", P.Results(ack_seq=0, pending_results=1, inflight_samples=0, results=[
        result(1, 9, 0, [], finish=P.FINISH_ABORT, n_prompt=12, seed=3, version_admit=2, version_finish=2,
               queued_us=5000, first_token_us=0, total_us=5000),
    ]), "an aborted sample that generated nothing: 0 tokens, 0 spans")


    # routing replay (protocol version 2, PROTOCOL.md §4.6)
    add("hello_v2", P.Hello(client_id=0, min_version=1, max_version=2, client_name="trainer-0"),
        "a client speaking versions 1 and 2, in a version-1 frame (which every daemon reads)")
    add("hello_ok_v2", LIMITS_V2, "a mixture-of-experts daemon chose version 2: features WEIGHT_UPDATE, RELAY, ROUTES")
    add("submit_routes", P.Submit(client_id=0x0123456789ABCDEF, requests=[
        req(1, [1, 9690, 314, 253], n=4, max_tokens=64, seed=7, flags=P.REQ_HAS_SEED | P.REQ_RETURN_ROUTES),
        req(2, [5, 6], max_tokens=8, flags=P.REQ_RETURN_ROUTES | 0x40),
        req(3, [5, 6], max_tokens=8),
    ]), "version 2: a request asking for routed experts; one with an undefined flag besides; one asking nothing",
        check=[0, 7, 0], check_limits="hello_ok_v2.bin", version=2)
    rng = np.random.default_rng(2026)
    x1 = result(50, 1, 3, [(0, 3, 7)], sample_idx=0, n_prompt=4, seed=7, version_admit=7, version_finish=7,
                queued_us=10, first_token_us=20, total_us=30)
    x1.flags |= P.RESULT_ROUTES
    x1.routes = routes(rng, 4 + 3 - 1, 2, 3, 128)
    x2 = result(51, 1, 0, [], finish=P.FINISH_ABORT, sample_idx=1, n_prompt=4, seed=7, version_admit=7,
                version_finish=7, queued_us=5, first_token_us=0, total_us=5)
    x2.flags |= P.RESULT_ROUTES
    x2.routes = np.zeros((0, 2, 3), dtype="<u1")
    x3 = result(52, 3, 2, [(0, 2, 7)], sample_idx=0, n_prompt=2, seed=9, version_admit=7, version_finish=7,
                queued_us=1, first_token_us=2, total_us=3)
    add("results_routes", P.Results(ack_seq=49, pending_results=0, inflight_samples=2, results=[x1, x2, x3]),
        "version 2: routes of 6 positions (4 prompt + 3 generated - 1) x 2 layers x top-3 of 128 experts as uint8; "
        "an aborted sample that asked but never ran (0 positions); a result that did not ask (no routes)",
        version=2)
    x4 = result(53, 4, 2, [(0, 1, 7), (1, 2, 8)], top_k=2, processed=True, sample_idx=0, n_prompt=1, seed=1,
                version_admit=7, version_finish=8, queued_us=1, first_token_us=2, total_us=3)
    x4.flags |= P.RESULT_ROUTES
    x4.routes = routes(rng, 1 + 2 - 1, 3, 2, 300)
    add("results_routes_u16", P.Results(ack_seq=52, results=[x4]),
        "version 2: 300 experts (ids as uint16), with processed log-probs, top-2 alternatives and two spans", version=2)
    x5 = result(54, 5, 1, [(0, 1, 7)], sample_idx=0, n_prompt=2, seed=1, version_admit=7, version_finish=7,
                queued_us=1, first_token_us=2, total_us=3)
    x5.flags |= P.RESULT_ROUTES
    x5.routes = np.array([[[70000, 3]], [[2 ** 31 - 1, -1]]], dtype="<i4")
    add("results_routes_i32", P.Results(ack_seq=53, results=[x5]),
        "version 2: ids as int32 (past 65536 experts): 2 positions x 1 layer x top-2, the full i32 range", version=2)

    # the sampling tail (protocol version 4, PROTOCOL.md §4.3)
    add("hello_ok_v3", LIMITS_V3, "hello_ok's dense daemon chose version 3 (no sampling tail yet)")
    add("hello_ok_v4", LIMITS_V4, "hello_ok's dense daemon chose version 4: requests may carry the sampling tail")
    add("submit_sampling", P.Submit(client_id=0x0123456789ABCDEF, requests=[
        sampled(1, [1, 9690, 314, 253], n=4, max_tokens=64, temperature=0.75, seed=11,
                flags=P.REQ_HAS_SEED | P.REQ_PROCESSED_LOGPROBS, repetition_penalty=1.25, frequency_penalty=0.5,
                presence_penalty=-0.25, min_tokens=8, bias=[(2, -100.0), (314, 2.5), (49151, 0.125)]),
        sampled(2, text="Say hi 👋", max_tokens=16, flags=P.REQ_CHAT_TEMPLATE),
        req(3, [5, 6], max_tokens=8),
        sampled(4, [7], max_tokens=2, min_tokens=2, bias=[(0, 100.0), (1, -100.0)]),
    ]), "version 4: penalties, min_tokens and 3 logit_bias pairs with token ids; a text prompt whose tail holds "
        "the defaults; a request without the tail; a last request whose tail ends the frame",
        check=[0, 0, 0, 0], check_limits="hello_ok_v4.bin", version=4)
    add("submit_sampling_invalid", P.Submit(client_id=42, requests=[
        sampled(30, [1, 2, 3], repetition_penalty=math.nan),
        sampled(31, [1, 2, 3], repetition_penalty=0.0),
        sampled(32, [1, 2, 3], repetition_penalty=math.inf),
        sampled(33, [1, 2, 3], frequency_penalty=2.5),
        sampled(34, [1, 2, 3], presence_penalty=-3.0),
        sampled(35, [1, 2, 3], presence_penalty=math.nan),
        sampled(36, [1, 2, 3], max_tokens=4, min_tokens=5),
        sampled(37, [1, 2, 3], bias=[(5, 1.0), (49152, 1.0)]),
        sampled(38, [1, 2, 3], bias=[(-1, 1.0)]),
        sampled(39, [1, 2, 3], bias=[(5, 100.5)]),
        sampled(40, [1, 2, 3], bias=[(5, math.nan)]),
        sampled(41, [1, 2, 3], bias=[(9, 1.0), (5, 1.0), (9, -1.0)]),
        sampled(42, [1, 2, 3], max_tokens=4, repetition_penalty=0.00048828125, frequency_penalty=-2.0,
                presence_penalty=2.0, min_tokens=4, bias=[(0, 100.0), (49151, -100.0)]),
    ]), "version 4: well-formed sampling tails that proto_check_request refuses against hello_ok_v4 (all but the "
        "last, at the bounds: min_tokens = max_tokens, penalties and biases at their limits; the count limit, "
        "1024 pairs, is the unit tests')", check=[7] * 12 + [0], check_limits="hello_ok_v4.bin", version=4)
    add("submit_sampling_v3", P.Submit(client_id=42, requests=[
        req(50, [1, 2, 3], max_tokens=4, flags=P.REQ_SAMPLING),
        req(51, [1, 2, 3], max_tokens=4),
    ]), "version 3: the SAMPLING bit is undefined there, so no tail is read and check_request refuses the bit; "
        "the request without it is fine", check=[7, 0], check_limits="hello_ok_v3.bin", version=3)

    # prompt scoring (protocol version 5, PROTOCOL.md §4.3, §4.6)
    add("hello_ok_v5", LIMITS_V5, "hello_ok's dense daemon chose version 5: requests may score their prompt")
    add("submit_score", P.Submit(client_id=0x0123456789ABCDEF, requests=[
        scored(1, [1, 9690, 314, 253, 42], max_tokens=0, logprobs_topk=2),
        scored(2, [1, 9690, 314, 253], score_from=3, max_tokens=16, temperature=0.5, seed=5,
               flags=P.REQ_HAS_SEED | P.REQ_SAMPLING, repetition_penalty=1.125, bias=[(2, -100.0)]),
        scored(3, text="Score me ✓", score_from=1, max_tokens=0, flags=P.REQ_CHAT_TEMPLATE),
        req(4, [5, 6], max_tokens=8),
        scored(5, [7, 8, 9], score_from=3, n=2, max_tokens=4),
    ]), "version 5: score only from position 0 with 2 alternatives; a rollout scoring its prompt from position 3 "
        "with a sampling tail before the score tail; a text prompt scored only; a request without either tail; a "
        "last request scoring from the prompt's end (nothing), whose score tail ends the frame",
        check=[0, 0, 0, 0, 0], check_limits="hello_ok_v5.bin", version=5)
    add("submit_score_invalid", P.Submit(client_id=42, requests=[
        scored(60, [1, 2, 3], score_from=4),
        scored(61, [1, 2, 3], score_from=-1),
        req(62, [1, 2, 3], max_tokens=0),
        scored(63, [1, 2, 3], max_tokens=0, n=2),
        scored(64, text="x", score_from=-5),
        scored(65, [1, 2, 3], max_tokens=8193),
        scored(66, [1, 2, 3], score_from=3, max_tokens=0),
        scored(67, text="hello", score_from=100, max_tokens=0),
    ]), "version 5: well-formed score tails that proto_check_request refuses against hello_ok_v5: score_from past "
        "the prompt and negative, max_tokens 0 without the flag, n 2 with max_tokens 0, a negative score_from on a "
        "text prompt, max_tokens past the limit; the last two pass (score_from = n_prompt; a text prompt's "
        "score_from is checked once the daemon has tokenized it)",
        check=[7] * 6 + [0, 0], check_limits="hello_ok_v5.bin", version=5)
    add("submit_score_v4", P.Submit(client_id=42, requests=[
        req(70, [1, 2, 3], max_tokens=4, flags=P.REQ_SCORE),
        req(71, [1, 2, 3], max_tokens=0, flags=P.REQ_SCORE),
        req(72, [1, 2, 3], max_tokens=4),
    ]), "version 4: the SCORE bit is undefined there, so no tail is read and check_request refuses the bit (with "
        "max_tokens 4 or 0); the request without it is fine", check=[7, 7, 0], check_limits="hello_ok_v4.bin",
        version=4)
    xs1 = with_scores(result(70, 1, 0, [], top_k=2, finish=P.FINISH_LENGTH, sample_idx=0, n_prompt=5, seed=3,
                             version_admit=7, version_finish=7, queued_us=4, first_token_us=0, total_us=900), 0)
    xs1.flags |= P.RESULT_SERVE
    xs1.serve_dtype = xs1.serve_dtype_first = P.SERVE_AS_PUSHED
    xs2 = with_scores(result(71, 2, 3, [(0, 3, 7)], sample_idx=0, n_prompt=4, seed=5, version_admit=7,
                             version_finish=7, queued_us=1, first_token_us=2, total_us=3), 2)
    xs2.flags |= P.RESULT_SERVE
    xs2.serve_dtype = xs2.serve_dtype_first = P.SERVE_AS_PUSHED
    xs3 = with_scores(result(72, 3, 0, [], top_k=1, finish=P.FINISH_ABORT, sample_idx=0, n_prompt=6, seed=3,
                             version_admit=7, version_finish=7, queued_us=5, first_token_us=0, total_us=5), 1,
                      n_scored=0)
    xs3.flags |= P.RESULT_SERVE
    xs4 = with_scores(result(73, 4, 1, [(0, 1, 7)], top_k=1, sample_idx=1, n_prompt=2, seed=7, version_admit=7,
                             version_finish=7, queued_us=1, first_token_us=2, total_us=3), 2)
    xs4.flags |= P.RESULT_ROUTES | P.RESULT_SERVE
    xs4.routes = routes(np.random.default_rng(2027), 2 + 1 - 1, 2, 3, 128)
    xs4.serve_dtype = xs4.serve_dtype_first = P.SERVE_Q8_0
    xs5 = with_scores(result(74, 4, 1, [(0, 1, 7)], top_k=1, sample_idx=0, n_prompt=2, seed=7, version_admit=7,
                             version_finish=7, queued_us=1, first_token_us=2, total_us=3), 0)
    add("results_scores", P.Results(ack_seq=69, pending_results=0, inflight_samples=1,
                                    results=[xs1, xs2, xs3, xs4, xs5]),
        "version 5: a score-only result (no tokens) from position 0, NaN there, 2 alternatives per position; a "
        "rollout's prompt scored from position 2; an aborted scored sample with no scores held (n_scored 0); "
        "routes, serve tail and scores together, from the prompt's end (none); without the serve tail, the "
        "scores ending the frame", version=5)

    # LoRA adapters (protocol version 6, PROTOCOL.md §4.3, §4.6)
    add("hello_ok_v6", LIMITS_V6, "hello_ok's dense daemon chose version 6: requests may name a LoRA adapter")
    add("submit_lora", P.Submit(client_id=0x0123456789ABCDEF, requests=[
        adapted(1, [1, 9690, 314, 253], n=4, max_tokens=64, temperature=0.75, seed=11, flags=P.REQ_HAS_SEED),
        adapted(2, text="Solve: 2 + 2 = ?", lora="数学-lora ✓", max_tokens=16, flags=P.REQ_CHAT_TEMPLATE),
        adapted(3, [1, 9690, 314, 253], lora="a", max_tokens=8, flags=P.REQ_SAMPLING | P.REQ_SCORE, score_from=2,
                repetition_penalty=1.125, bias=[(2, -100.0)]),
        req(4, [5, 6], max_tokens=8),
        adapted(5, [7], lora="x" * 127, max_tokens=2),
    ]), "version 6: a seeded rollout under adapter math-v1; a chat text prompt under a non-ASCII adapter name; a "
        "request with the sampling tail, the score tail, then the lora tail (a 1-byte name); a request on the base "
        "model (no tail); a last request whose 127-byte name (the longest) ends the frame",
        check=[0, 0, 0, 0, 0], check_limits="hello_ok_v6.bin", version=6)
    add("submit_lora_invalid", P.Submit(client_id=42, requests=[
        adapted(80, [1, 2, 3], flags=P.REQ_RETURN_ROUTES),
        adapted(81, [1, 2, 3], flags=0x200),
        adapted(82, [1, 2, 3], n=0),
        adapted(83, [1, 2, 3], lora="é" * 63 + "z"),
    ]), "version 6: well-formed lora tails in requests that proto_check_request refuses against hello_ok_v6: routes "
        "asked of a dense model, an undefined flag bit beside LORA, n 0; the last passes (a 127-byte name of 64 "
        "characters). A name with a NUL byte, also refused, is the unit tests' (JSON strings here are C strings "
        "there)",
        check=[7, 7, 7, 0], check_limits="hello_ok_v6.bin", version=6)
    add("submit_lora_v5", P.Submit(client_id=42, requests=[
        req(90, [1, 2, 3], max_tokens=4, flags=P.REQ_LORA),
        req(91, [1, 2, 3], max_tokens=4),
    ]), "version 5: the LORA bit is undefined there, so no tail is read and check_request refuses the bit; the "
        "request without it is fine", check=[7, 0], check_limits="hello_ok_v5.bin", version=5)
    xl1 = with_lora(result(80, 1, 4, [(0, 4, 7)], sample_idx=0, n_prompt=4, seed=11, version_admit=7,
                           version_finish=7, queued_us=3, first_token_us=40, total_us=90), "math-v1", 1)
    xl1.flags |= P.RESULT_SERVE
    xl1.serve_dtype = xl1.serve_dtype_first = P.SERVE_AS_PUSHED
    xl2 = with_lora(with_scores(result(81, 3, 2, [(0, 2, 7)], top_k=1, sample_idx=0, n_prompt=4, seed=5,
                                       version_admit=7, version_finish=7, queued_us=1, first_token_us=2, total_us=3),
                                2), "数学-lora ✓", 3)
    xl2.flags |= P.RESULT_SERVE
    xl2.serve_dtype = xl2.serve_dtype_first = P.SERVE_Q8_0
    xl3 = with_lora(result(82, 1, 0, [], finish=P.FINISH_ERROR, sample_idx=1, n_prompt=4, seed=11, version_admit=7,
                           version_finish=7, queued_us=0, first_token_us=0, total_us=5), "math-v1", 0)
    xl4 = result(83, 4, 1, [(0, 1, 7)], sample_idx=0, n_prompt=2, seed=9, version_admit=7, version_finish=7,
                 queued_us=1, first_token_us=2, total_us=3)
    xl5 = with_lora(result(84, 5, 2, [(0, 1, 7), (1, 2, 8)], processed=True, sample_idx=0, n_prompt=1, seed=1,
                           version_admit=7, version_finish=8, queued_us=1, first_token_us=2, total_us=3),
                    "math-v1", 2 ** 64 - 1)
    add("results_lora", P.Results(ack_seq=79, pending_results=0, inflight_samples=2,
                                  results=[xl1, xl2, xl3, xl4, xl5]),
        "version 6: a rollout under adapter math-v1 version 1 (serve tail, then the lora tail); scores then a "
        "non-ASCII adapter at version 3; a sample that failed before it ran (version 0: not known); a base-model "
        "result (no tail); a last result, across a push, whose lora tail (max u64 version) ends the frame",
        version=6)

    # serve_dtype (protocol version 3, PROTOCOL.md §4.6, §10.1)
    x6 = result(60, 6, 2, [(0, 1, 7), (1, 2, 8)], sample_idx=0, n_prompt=3, seed=1, version_admit=7,
                version_finish=8, queued_us=1, first_token_us=2, total_us=3)
    x6.flags |= P.RESULT_SERVE
    x6.serve_dtype, x6.serve_dtype_first = P.SERVE_Q8_0, P.SERVE_AS_PUSHED
    x7 = result(61, 7, 1, [(0, 1, 7)], sample_idx=0, n_prompt=4, seed=7, version_admit=7, version_finish=7,
                queued_us=10, first_token_us=20, total_us=30)
    x7.flags |= P.RESULT_ROUTES | P.RESULT_SERVE
    x7.routes = routes(rng, 4 + 1 - 1, 2, 3, 128)
    x7.serve_dtype = x7.serve_dtype_first = P.SERVE_Q8_0
    x8 = result(62, 8, 1, [(0, 1, 2 ** 40)], sample_idx=0, n_prompt=1, seed=7, version_admit=2 ** 40,
                version_finish=2 ** 40, queued_us=1, first_token_us=2, total_us=3)
    x8.flags |= P.RESULT_SERVE        # serve_dtype 0: a version older than the daemon's history
    add("results_serve", P.Results(ack_seq=59, results=[x6, x7, x8]),
        "version 3: a result whose spans cross a push that changed serve_dtype (as_pushed, then q8_0); one with "
        "routes then the serve tail; one of an unknown serve_dtype (0)", version=3)
    add("update_begin_serve", P.UpdateBegin(client_id=7, version=9, mode=P.MODE_CONTINUE, serve_dtype=P.SERVE_Q8_0,
                                            window=4, max_chunk_bytes=1 << 20, total_bytes=0, tensors=[
        tensor("model.norm.weight", P.DTYPE_BF16, [576], 0x3C6EF372),
    ]), "version 3: a push asking to be served as q8_0", total=True, version=3)

    add("abort", P.Abort(client_id=42, client_req_id=7), "abort one request")
    add("abort_all", P.Abort(client_id=42, client_req_id=0, flags=P.ABORT_ALL), "abort every request of the client")
    add("abort_ok", P.AbortOk(n_requests=3, n_samples=17), "3 requests aborted, 17 partial samples to come")
    add("status", P.Status(), "STATUS has an empty body")
    add("status_ok", P.StatusOk(json=json.dumps({"model": "SmolLM2-135M-Instruct", "backend": "cpu",
                                                 "weight_version": 7, "uptime_s": 12.5, "note": "ünïcödé ✓"},
                                                ensure_ascii=False)), "the /status document")
    add("bye", P.Bye(client_id=42), "a client leaving after fetching everything")
    add("bye_discard", P.Bye(client_id=42, flags=P.BYE_DISCARD), "leave now, dropping results")
    add("bye_ok", P.ByeOk(pending_results=0, inflight_samples=0), "forgotten")
    add("error", P.Error(code=P.E.INVALID_PARAMS, request_type=P.T.SUBMIT, version_max=1,
                         message="SUBMIT: 2000 requests; the limit is max_requests_per_submit = 1024"),
        "an ERROR reply naming what was wrong and what was expected")
    add("error_unknown_request", P.Error(code=P.E.BAD_MAGIC, request_type=0, version_max=1,
                                         message="magic is 47 45 54 20; expected 52 4c 44 50 (\"RLDP\")"),
        "an ERROR for a frame whose header was unreadable: request_type 0")

    # authentication (PROTOCOL.md §14)
    add("auth_begin", P.AuthBegin(bytes=bytes(range(32))), "the client's 32-byte nonce")
    add("auth_challenge", P.AuthChallenge(bytes=bytes(range(0xA0, 0xC0))), "the daemon's 32-byte nonce")
    add("auth", P.Auth(bytes=bytes(range(0x40, 0x60))), "the client's proof, HMAC-SHA256 over both nonces")
    add("auth_ok", P.AuthOk(bytes=bytes(range(0xE0, 0x100))), "the daemon's proof")
    # the chain (PROTOCOL.md §10.11, §10.12)
    add("update_forward", P.UpdateForward(xfer_id=0x1122334455667788, next_xfer_id=0x0102030405060708, port=7072,
                                          flags=P.FORWARD_AUTH, window=4, key=bytes(range(0x10, 0x30)),
                                          host="10.0.0.2"), "relay this transfer to 10.0.0.2:7072, key wrapped")
    add("update_forward_stop", P.UpdateForward(xfer_id=0x1122334455667788), "stop forwarding (next_xfer_id 0)")
    add("update_forward_ok", P.UpdateForwardOk(xfer_id=0x1122334455667788, queued_bytes=33554432),
        "32 MiB already staged go to the next daemon first")
    add("update_prepare", P.UpdatePrepare(xfer_id=0x1122334455667788), "verify and build, do not swap")
    add("update_prepare_ok", P.UpdatePrepareOk(xfer_id=0x1122334455667788, state=P.PREP_READY, forward=P.FWD_DONE,
                                               bytes_staged=538000000, total_bytes=538000000,
                                               forwarded_bytes=538000000), "built here, relayed to the next")
    add("update_prepare_ok_failed", P.UpdatePrepareOk(xfer_id=0x1122334455667788, state=P.PREP_STAGING,
                                                      forward=P.FWD_FAILED, forward_error=P.E.UNAUTHORIZED,
                                                      bytes_staged=4096, total_bytes=538000000),
        "still staging; the next daemon refused the relay's LANE_AUTH")
    add("weights_sync", P.WeightsSync(client_id=42, url="tcp://10.0.0.9:7070"),
        "push your serving weights to the daemon at tcp://10.0.0.9:7070")
    add("weights_sync_ok", P.WeightsSyncOk(version=12), "version 12 is on its way")
    # a LoRA adapter's push (PROTOCOL.md §10.15)
    add("adapter_begin", P.AdapterBegin(
        client_id=42, version=3, flags=P.ADAPTER_RSLORA, rank=8, lora_alpha=16.0, window=4, max_chunk_bytes=1 << 20,
        total_bytes=2 * 8 * 576 * 2, name="math",
        tensors=[P.Tensor(name="base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", dtype=P.DTYPE_BF16,
                          shape=[8, 576], nbytes=8 * 576 * 2, crc32c=0x1234ABCD),
                 P.Tensor(name="base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", dtype=P.DTYPE_BF16,
                          shape=[576, 8], nbytes=576 * 8 * 2, crc32c=0x0F0E0D0C)]),
        "adapter 'math' version 3: one q_proj pair, rank 8, rsLoRA")
    add("adapter_begin_ok", P.AdapterBeginOk(xfer_id=0x1122334455667788, window=4, max_chunk_bytes=1 << 20,
                                             staging_bytes=18432, data_port=7072), "staged like any transfer")
    add("lane_auth", P.LaneAuth(xfer_id=0x1122334455667788, proof=bytes(range(0x60, 0x80))),
        "a data lane sender's proof for one transfer")
    add("error_unauthorized", P.Error(code=P.E.UNAUTHORIZED, request_type=P.T.SUBMIT, version_max=1,
                                      message="SUBMIT before AUTH: this daemon needs the shared secret (§14)"),
        "an ERROR for a request on a connection that has not authenticated")

    # weight updates (PROTOCOL.md §10)
    add("update_begin", P.UpdateBegin(client_id=0x0123456789ABCDEF, version=8, mode=P.MODE_CONTINUE, window=8,
                                      max_chunk_bytes=4 << 20, total_bytes=0, tensors=[
        tensor("model.embed_tokens.weight", P.DTYPE_BF16, [49152, 576], 0x6A09E667),
        tensor("model.layers.0.self_attn.q_proj.weight", P.DTYPE_F16, [576, 576], 0xBB67AE85),
        tensor("model.norm.weight", P.DTYPE_F32, [576], 0x3C6EF372),
    ]), "a manifest of 3 tensors: bf16 and f16 matrices, an f32 vector; total_bytes is their sum", total=True)
    add("update_begin_4d", P.UpdateBegin(client_id=42, version=2 ** 64 - 1, mode=P.MODE_ABORT, window=1,
                                         max_chunk_bytes=1, total_bytes=2 ** 64 - 1, tensors=[
        tensor("π." + "x" * 250 + "✓", P.DTYPE_F32, [2 ** 64 - 1, 3, 1, 0], 0xFFFFFFFF),
    ]), "abort mode; one 4-dimensional tensor with a 256-byte non-ASCII name; max u64 version, shape and sizes "
        "(the decoder checks structure only)")
    add("update_begin_drain_empty", P.UpdateBegin(client_id=7, version=3, mode=P.MODE_DRAIN, window=0,
                                                  max_chunk_bytes=0, total_bytes=0),
        "drain mode and no tensors: well-formed (the daemon answers INVALID_PARAMS)")
    # delta pushes (protocol version 3, PROTOCOL.md §10.14)
    dq = tensor("model.layers.0.self_attn.q_proj.weight", P.DTYPE_BF16, [576, 576], 0x510E527F)
    dq.flags, dq.wire_bytes, dq.base_version = P.TENSOR_DELTA, 12345, 7
    begin_delta = P.UpdateBegin(client_id=0x0123456789ABCDEF, version=8, mode=P.MODE_CONTINUE, window=8,
                                max_chunk_bytes=4 << 20, tensors=[
        dq, tensor("model.norm.weight", P.DTYPE_F32, [576], 0x3C6EF372)])
    begin_delta.total_bytes = 12345 + 4 * 576
    add("update_begin_delta_v3", begin_delta, "version 3: a q_proj delta of 12,345 wire bytes against version 7 "
        "(flags DELTA, wire_bytes and base_version after its crc32c) and a whole f32 norm; total_bytes counts the "
        "wire bytes", version=3)
    add("update_begin_ok", P.UpdateBeginOk(xfer_id=0xFEDCBA9876543210, window=4, max_chunk_bytes=4 << 20,
                                           staging_bytes=57288960, data_port=40123),
        "transfer opened for update_begin: a smaller window than asked (8), staging = total_bytes")
    data = np.arange(-16, 16, dtype="<f4").astype("<f2").tobytes() + bytes([0x00, 0xFF, 0x7F, 0x80])
    add("update_chunk", P.UpdateChunk(xfer_id=0xFEDCBA9876543210, chunk_seq=17, tensor_index=2, offset=1024,
                                      crc32c=crc32c(data), data=data),
        "68 bytes of tensor 2 at offset 1024, with their CRC-32C")
    add("update_chunk_empty", P.UpdateChunk(xfer_id=1, chunk_seq=0, tensor_index=0, offset=2 ** 64 - 1,
                                            crc32c=0, data=b""),
        "a chunk with no data: well-formed (the daemon answers INVALID_PARAMS)")
    add("update_chunk_ok", P.UpdateChunkOk(xfer_id=0xFEDCBA9876543210, chunk_seq=17, flags=0,
                                           bytes_staged=1 << 20, total_bytes=57288960), "a chunk staged")
    add("update_chunk_ok_duplicate", P.UpdateChunkOk(xfer_id=0xFEDCBA9876543210, chunk_seq=18,
                                                     flags=P.CHUNK_OK_DUPLICATE, bytes_staged=1 << 20,
                                                     total_bytes=57288960),
        "a resent chunk that was already staged: DUPLICATE")
    add("update_commit", P.UpdateCommit(xfer_id=0xFEDCBA9876543210), "commit the transfer")
    add("update_commit_ok", P.UpdateCommitOk(version=8, stall_us=1500, wait_us=42000, staged_us=3100000,
                                             n_aborted=0), "version 8 serves; the engine stalled 1.5 ms")
    add("update_commit_ok_aborted", P.UpdateCommitOk(version=2 ** 64 - 1, stall_us=0, wait_us=0, staged_us=0,
                                                     n_aborted=0xFFFFFFFF), "abort mode: samples aborted; max values")
    add("update_abort", P.UpdateAbort(xfer_id=0xFEDCBA9876543210), "drop the transfer")
    add("update_abort_ok", P.UpdateAbortOk(bytes_freed=57288960), "its staging memory released")
    return V


def tensor(name, dtype, shape, crc):
    n = P.dtype_size(dtype)
    for d in shape:
        n = n * d % 2 ** 64
    return P.Tensor(name=name, dtype=dtype, shape=shape, nbytes=n, crc32c=crc)


def frame(type_, body, version=P.VERSION_MIN, flags=0, magic=P.MAGIC, body_len=None):
    return struct.pack("<4sHHII", magic, version, type_, len(body) if body_len is None else body_len, flags) + body


def invalid_vectors(valid_frames):
    submit = valid_frames["submit_tokens"]
    results = valid_frames["results_basic"]
    hello_body = valid_frames["hello_new"][16:]
    I = []

    def add(name, data, code, desc, max_len=P.DEFAULT_MAX_MESSAGE):
        I.append((name, data, code, desc, max_len))

    add("empty", b"", P.E.MALFORMED, "zero bytes")
    add("truncated_header", submit[:10], P.E.MALFORMED, "10 bytes: shorter than the 16-byte header")
    add("bad_magic", b"GET / HTTP/1.1\r\n\r\n", P.E.BAD_MAGIC, "an HTTP request sent to the learner port")
    add("bad_magic_case", frame(P.T.STATUS, b"", magic=b"rldp"), P.E.BAD_MAGIC, "magic in the wrong case")
    add("bad_version", frame(P.T.HELLO, hello_body, version=P.VERSION + 1), P.E.UNSUPPORTED_VERSION,
        f"protocol version {P.VERSION + 1} (this codec speaks 1 to {P.VERSION})")
    add("bad_version_zero", frame(P.T.HELLO, hello_body, version=0), P.E.UNSUPPORTED_VERSION, "protocol version 0")
    add("truncated_body", submit[:-5], P.E.MALFORMED, "a SUBMIT missing its last 5 bytes (header unchanged)")
    add("length_larger_than_frame", frame(P.T.FETCH, valid_frames["fetch"][16:], body_len=32 + 100), P.E.MALFORMED,
        "the header declares 100 more body bytes than the frame carries")
    add("length_smaller_than_frame", frame(P.T.FETCH, valid_frames["fetch"][16:], body_len=28), P.E.MALFORMED,
        "the header declares 4 fewer body bytes than the frame carries")
    add("length_over_limit", frame(P.T.SUBMIT, submit[16:], body_len=0xFFFFFFF0), P.E.TOO_LARGE,
        "the header declares a 4 GiB body, above the 64 MiB limit")
    add("frame_over_limit", valid_frames["status_ok"], P.E.TOO_LARGE, "a whole frame above a 64-byte limit",
        max_len=64)
    add("header_flags", frame(P.T.STATUS, b"", flags=1), P.E.MALFORMED, "header flags 1 (reserved, must be 0)")
    add("unknown_type", frame(0x42, b""), P.E.UNKNOWN_TYPE, "message type 0x42")
    add("unknown_type_zero", frame(0, b""), P.E.UNKNOWN_TYPE, "message type 0")
    # the undefined types next to the update requests and replies, from the message table
    t = P.undefined_type_after(P.T.UPDATE_BEGIN)
    add("unknown_type_after_updates", frame(t, b"\0" * 8), P.E.UNKNOWN_TYPE,
        f"message type {t:#04x}, just past {P.T(t - 1).name}")
    t = P.undefined_type_after(P.T.UPDATE_BEGIN_OK)
    after = min(x for x in P.T if x > t)
    add("unknown_type_reply_after_updates", frame(t, b"\0" * 8), P.E.UNKNOWN_TYPE,
        f"message type {t:#04x}, between {P.T(t - 1).name} and {after.name}")
    add("weights_sync_empty_url", frame(P.T.WEIGHTS_SYNC, struct.pack("<QI", 42, 0)), P.E.MALFORMED,
        "WEIGHTS_SYNC with an empty url")
    add("forward_bad_flags", frame(P.T.UPDATE_FORWARD, struct.pack("<QQHHI", 1, 2, 7000, 2, 4) + b"\0" * 32 +
                                   struct.pack("<I", 9) + b"127.0.0.1"), P.E.MALFORMED,
        "UPDATE_FORWARD with flag bit 1 (undefined) set")
    add("forward_long_host", frame(P.T.UPDATE_FORWARD, struct.pack("<QQHHI", 1, 2, 7000, 0, 4) + b"\0" * 32 +
                                   struct.pack("<I", 256) + b"1" * 256), P.E.MALFORMED,
        "UPDATE_FORWARD with a 256-byte host (the limit is 255)")
    add("prepare_ok_bad_state", frame(P.T.UPDATE_PREPARE_OK, struct.pack("<QBBHIQQQ", 1, 3, 0, 0, 0, 0, 0, 0)),
        P.E.MALFORMED, "UPDATE_PREPARE_OK with state 3 (undefined)")
    add("auth_short", frame(P.T.AUTH, b"\1" * 31), P.E.MALFORMED, "an AUTH proof of 31 bytes")
    add("auth_trailing", frame(P.T.AUTH_BEGIN, b"\2" * 33), P.E.MALFORMED, "an AUTH_BEGIN nonce with a byte after it")
    add("unknown_type_after_auth", frame(0x09, b""), P.E.UNKNOWN_TYPE, "message type 0x09, just past AUTH")
    add("trailing_bytes", frame(P.T.FETCH, valid_frames["fetch"][16:] + b"\0\0\0\0"), P.E.MALFORMED,
        "a FETCH with 4 bytes after its last field (length field consistent)")
    add("status_with_body", frame(P.T.STATUS, b"\0"), P.E.MALFORMED, "STATUS must have an empty body")
    add("huge_request_count", frame(P.T.SUBMIT, struct.pack("<QI", 42, 0xFFFFFFFF)), P.E.MALFORMED,
        "n_requests = 2^32-1 in a 12-byte body: refused before any allocation")
    rbody = bytearray(results[16:])
    struct.pack_into("<I", rbody, 24 + 80, 0x40000000)
    add("huge_token_count", frame(P.T.RESULTS, bytes(rbody)), P.E.MALFORMED,
        "a result claiming 2^30 tokens")
    sbody = bytearray(submit[16:])
    struct.pack_into("<I", sbody, 12 + 48, 0xFFFFFFFF)
    add("huge_stop_count", frame(P.T.SUBMIT, bytes(sbody)), P.E.MALFORMED, "a request claiming 2^32-1 stop ids")
    steal = struct.pack("<QI", 42, 16) + bytes(48) + struct.pack("<I", 260) + bytes(1040) + bytes(4)
    add("array_steals_bytes", frame(P.T.SUBMIT, steal), P.E.MALFORMED,
        "16 requests, the first claiming 260 stop ids: bytes the other 15 requests need at least")
    add("huge_string", frame(P.T.HELLO, struct.pack("<QHHII", 0, 1, 1, 0, 0x7FFFFFFF) + b"abc"), P.E.MALFORMED,
        "a client_name claiming 2 GiB")
    for name, raw, desc in (("bad_utf8_overlong", b"\xc0\x80", "an overlong encoding of NUL"),
                            ("bad_utf8_surrogate", b"\xed\xa0\x80", "a UTF-16 surrogate (U+D800)"),
                            ("bad_utf8_truncated", b"ab\xe4\xb8", "a 3-byte sequence cut after 2 bytes"),
                            ("bad_utf8_above_max", b"\xf4\x90\x80\x80", "a code point above U+10FFFF")):
        add(name, frame(P.T.HELLO, struct.pack("<QHHII", 0, 1, 1, 0, len(raw)) + raw), P.E.MALFORMED,
            f"client_name with {desc}")
    add("hello_flags", frame(P.T.HELLO, struct.pack("<QHHII", 0, 1, 1, 4, 0)), P.E.MALFORMED,
        "HELLO flags 4 (no flags are defined)")
    rbody = bytearray(results[16:])
    rbody[24 + 20] = 9
    add("bad_finish", frame(P.T.RESULTS, bytes(rbody)), P.E.MALFORMED, "finish reason 9")
    rbody = bytearray(results[16:])
    span_end = 24 + 84 + 6 * 8 + 4 + 4   # body header, fixed fields, 6 tokens x (id, log-prob), n_spans, start
    assert struct.unpack_from("<I", rbody, span_end)[0] == 6
    struct.pack_into("<I", rbody, span_end, 5)
    add("bad_spans_gap", frame(P.T.RESULTS, bytes(rbody)), P.E.MALFORMED,
        "spans [0,5) for 6 tokens: not covering the tokens")
    add("error_code_zero", frame(P.T.ERROR, struct.pack("<IHHI", 0, 1, 1, 0)), P.E.MALFORMED, "ERROR with code 0")
    add("abort_flags", frame(P.T.ABORT, struct.pack("<QQI", 1, 2, 0x80)), P.E.MALFORMED, "ABORT flags 0x80")
    update_invalid(valid_frames, add)
    routes_invalid(valid_frames, add)
    serve_invalid(valid_frames, add)
    sampling_invalid(valid_frames, add)
    scores_invalid(valid_frames, add)
    lora_invalid(valid_frames, add)
    return I


def sampling_invalid(valid_frames, add):
    """Invalid sampling tails (version 4): submit_sampling, whose last request's tail (min_tokens 2, two bias
    pairs) ends the frame, with one thing broken."""
    body = valid_frames["submit_sampling"][16:]
    tail = len(body) - 2 * 8 - P.SAMPLING_TAIL_BYTES    # the last request's tail
    assert struct.unpack_from("<fffII", body, tail) == (1.0, 0.0, 0.0, 2, 2)
    n_bias = tail + 16

    def patched(at, fmt, value):
        b = bytearray(body)
        struct.pack_into(fmt, b, at, value)
        return bytes(b)

    S = P.T.SUBMIT
    add("sampling_truncated", frame(S, body[:tail + 6], version=4), P.E.MALFORMED,
        "the last request's sampling tail cut inside frequency_penalty")
    add("sampling_truncated_pair", frame(S, body[:-4], version=4), P.E.MALFORMED,
        "the last bias pair cut after its token id")
    add("sampling_bias_count_over_bytes", frame(S, patched(n_bias, "<I", 3), version=4), P.E.MALFORMED,
        "n_bias 3 with the bytes of 2 pairs")
    add("sampling_huge_bias_count", frame(S, patched(n_bias, "<I", 0xFFFFFFFF), version=4), P.E.MALFORMED,
        "n_bias 2^32-1: refused before any allocation")
    add("sampling_trailing_byte", frame(S, body + b"\0", version=4), P.E.MALFORMED, "a byte after the last tail")
    add("sampling_tail_in_v3", frame(S, body, version=3), P.E.MALFORMED,
        "the version-4 SUBMIT in a version-3 frame: SAMPLING switches no tail on there, so the first tail is "
        "read as the next request")


def scores_invalid(valid_frames, add):
    """Invalid prompt-scoring frames (version 5): submit_score, whose last request's score tail ends the frame,
    and results_scores, whose last result (xs5: 2 prompt positions scored from 0, top-1) ends with its scores,
    with one thing broken."""
    sub = valid_frames["submit_score"][16:]
    assert struct.unpack_from("<i", sub, len(sub) - 4) == (3,)
    body = valid_frames["results_scores"][16:]
    head = len(body) - 2 * (4 + 8) - P.SCORES_HEAD_BYTES    # xs5's scores head
    assert struct.unpack_from("<III", body, head) == (0, 0, 2)

    def patched(b, at, fmt, value):
        b = bytearray(b)
        struct.pack_into(fmt, b, at, value)
        return bytes(b)

    S, R = P.T.SUBMIT, P.T.RESULTS
    add("score_tail_truncated", frame(S, sub[:-2], version=5), P.E.MALFORMED,
        "the last request's score tail cut in half")
    add("score_tail_trailing_byte", frame(S, sub + b"\0", version=5), P.E.MALFORMED, "a byte after the last tail")
    add("score_tail_in_v4", frame(S, sub, version=4), P.E.MALFORMED,
        "the version-5 SUBMIT in a version-4 frame: SCORE switches no tail on there, so the first score tail is "
        "read as the next request")
    add("scores_in_v4", frame(R, body, version=4), P.E.MALFORMED,
        "a version-4 RESULTS with the SCORES flag (bit 3 is undefined before version 5)")
    add("scores_truncated", frame(R, body[:-6], version=5), P.E.MALFORMED,
        "the last result's alternatives cut inside their log-probs")
    add("scores_from_past_prompt", frame(R, patched(body, head, "<I", 3), version=5), P.E.MALFORMED,
        "score_from 3 in a prompt of 2 tokens")
    add("scores_count_mismatch", frame(R, patched(body, head + 8, "<I", 1), version=5), P.E.MALFORMED,
        "n_scored 1 where scores from position 0 of a 2-token prompt carry 2 (or none)")
    add("scores_huge_count", frame(R, patched(body, head + 8, "<I", 0xFFFFFFFF), version=5), P.E.MALFORMED,
        "n_scored 2^32-1: refused before any allocation")
    add("scores_flags", frame(R, patched(body, head + 4, "<I", 1), version=5), P.E.MALFORMED,
        "scores flags 1 (none defined)")
    add("scores_trailing_byte", frame(R, body + b"\0", version=5), P.E.MALFORMED, "a byte after the last scores")


def lora_invalid(valid_frames, add):
    """Invalid LoRA frames (version 6): submit_lora, whose last request's lora tail (a 127-byte name) ends the
    frame, and results_lora, whose last result ends with its lora tail ("math-v1", version 2^64-1), with one
    thing broken."""
    sub = valid_frames["submit_lora"][16:]
    tail = len(sub) - 127 - P.LORA_TAIL_BYTES
    assert struct.unpack_from("<H", sub, tail) == (127,) and sub[tail + 2:] == b"x" * 127
    body = valid_frames["results_lora"][16:]
    rt = len(body) - 7 - P.RESULT_LORA_BYTES
    assert struct.unpack_from("<H", body, rt) == (7,) and body[rt + 2:rt + 9] == b"math-v1"

    def patched(b, at, fmt, value):
        b = bytearray(b)
        struct.pack_into(fmt, b, at, value)
        return bytes(b)

    S, R = P.T.SUBMIT, P.T.RESULTS
    add("lora_tail_truncated", frame(S, sub[:-1], version=6), P.E.MALFORMED,
        "the last request's adapter name cut by 1 byte")
    add("lora_tail_cut_in_length", frame(S, sub[:tail + 1], version=6), P.E.MALFORMED,
        "the last request's lora tail cut inside its u16 length")
    add("lora_name_empty", frame(S, sub[:tail] + struct.pack("<H", 0), version=6), P.E.MALFORMED,
        "a lora tail with a 0-byte name (a request without an adapter has no flag and no tail)")
    add("lora_name_too_long", frame(S, sub[:tail] + struct.pack("<H", 128) + b"x" * 128, version=6), P.E.MALFORMED,
        "a 128-byte adapter name (the limit is 127)")
    add("lora_name_huge", frame(S, patched(sub, tail, "<H", 0xFFFF), version=6), P.E.MALFORMED,
        "an adapter name claiming 65535 bytes")
    add("lora_name_bad_utf8", frame(S, patched(sub, tail + 2, "<B", 0xC0), version=6), P.E.MALFORMED,
        "an adapter name starting with 0xC0 (never valid UTF-8)")
    add("lora_tail_trailing_byte", frame(S, sub + b"\0", version=6), P.E.MALFORMED, "a byte after the last tail")
    add("lora_tail_in_v5", frame(S, sub, version=5), P.E.MALFORMED,
        "the version-6 SUBMIT in a version-5 frame: LORA switches no tail on there, so the first lora tail is "
        "read as the next request")
    add("results_lora_in_v5", frame(R, body, version=5), P.E.MALFORMED,
        "a version-5 RESULTS with the LORA flag (bit 4 is undefined before version 6)")
    add("results_lora_truncated", frame(R, body[:-3], version=6), P.E.MALFORMED,
        "the last result's lora_version cut by 3 bytes")
    add("results_lora_name_empty", frame(R, patched(body, rt, "<H", 0), version=6), P.E.MALFORMED,
        "a result's lora tail with a 0-byte name")
    add("results_lora_name_bad_utf8", frame(R, patched(body, rt + 2, "<B", 0xFF), version=6), P.E.MALFORMED,
        "a result's adapter name starting with 0xFF")
    add("results_lora_trailing_byte", frame(R, body + b"\0", version=6), P.E.MALFORMED,
        "a byte after the last lora tail")


def routes_invalid(valid_frames, add):
    """Invalid routing-replay frames: results_routes_i32 (one result: 1 token, 1 span, 2 x 1 x 2 int32 ids)
    with one thing broken."""
    body = valid_frames["results_routes_i32"][16:]
    head = 24 + 84 + 8 + 4 + 16                 # body header, fixed fields, 1 token, n_spans, 1 span: the routes
    assert struct.unpack_from("<IHBB", body, head) == (2, 1, 2, 4)

    def patched(at, fmt, value):
        b = bytearray(body)
        struct.pack_into(fmt, b, at, value)
        return bytes(b)

    R = P.T.RESULTS
    add("routes_in_v1", frame(R, body, version=1), P.E.MALFORMED,
        "a version-1 RESULTS with the ROUTES flag (bit 1 is undefined in version 1)")
    add("routes_bad_width", frame(R, patched(head + 7, "<B", 3), version=2), P.E.MALFORMED, "route_width 3")
    add("routes_zero_layers", frame(R, patched(head + 4, "<H", 0), version=2), P.E.MALFORMED, "route_layers 0")
    add("routes_zero_k", frame(R, patched(head + 6, "<B", 0), version=2), P.E.MALFORMED, "route_k 0")
    add("routes_count_over_bytes", frame(R, patched(head, "<I", 3), version=2), P.E.MALFORMED,
        "n_routes 3 with the ids of 2 in the body")
    add("routes_huge_count", frame(R, patched(head, "<I", 0xFFFFFFFF), version=2), P.E.MALFORMED,
        "n_routes 2^32-1: refused before any allocation")
    add("routes_trailing_byte", frame(R, body + b"\0", version=2), P.E.MALFORMED, "a byte after the routes")
    add("routes_truncated_head", frame(R, body[:head + 6], version=2), P.E.MALFORMED,
        "the routes' head cut after 6 of its 8 bytes")


def serve_invalid(valid_frames, add):
    """Invalid serve_dtype frames (version 3): results_serve and update_begin_serve with one thing broken."""
    body = valid_frames["results_serve"][16:]
    tail = 24 + 84 + 2 * 8 + 4 + 2 * 16      # body header, fixed fields, 2 tokens, n_spans, 2 spans: x6's tail
    assert struct.unpack_from("<BBH", body, tail) == (P.SERVE_Q8_0, P.SERVE_AS_PUSHED, 0)

    def patched(b, at, fmt, value):
        b = bytearray(b)
        struct.pack_into(fmt, b, at, value)
        return bytes(b)

    R = P.T.RESULTS
    add("serve_in_v2", frame(R, body, version=2), P.E.MALFORMED,
        "a version-2 RESULTS with the SERVE flag (bit 2 is undefined before version 3)")
    add("serve_bad_code", frame(R, patched(body, tail, "<B", 5), version=3), P.E.MALFORMED, "serve_dtype 5")
    add("serve_bad_first", frame(R, patched(body, tail + 1, "<B", 9), version=3), P.E.MALFORMED,
        "serve_dtype_first 9")
    add("serve_reserved", frame(R, patched(body, tail + 2, "<H", 1), version=3), P.E.MALFORMED,
        "the serve tail's reserved u16 is 1")
    ub = valid_frames["update_begin_serve"][16:]
    assert ub[16:20] == bytes([P.MODE_CONTINUE, P.SERVE_Q8_0, 0, 0])
    U = P.T.UPDATE_BEGIN
    add("update_begin_serve_in_v2", frame(U, ub, version=2), P.E.MALFORMED,
        "a version-2 UPDATE_BEGIN with serve_dtype 2 (byte 17 is reserved before version 3)")
    add("update_begin_serve_bad", frame(U, patched(ub, 17, "<B", 5), version=3), P.E.MALFORMED, "serve_dtype 5")
    add("update_begin_serve_reserved", frame(U, patched(ub, 18, "<B", 1), version=3), P.E.MALFORMED,
        "the reserved byte after serve_dtype is 1")


def update_invalid(valid_frames, add):
    """Invalid weight-update frames: each a valid one with one thing broken."""
    begin = valid_frames["update_begin"][16:]
    t0 = 40                                     # first tensor in the body
    name0 = struct.unpack_from("<I", begin, t0)[0]
    dt0 = t0 + 4 + name0                        # its dtype byte; n_dims, reserved u16 and shape follow

    def patched(body, at, fmt, value):
        b = bytearray(body)
        struct.pack_into(fmt, b, at, value)
        return bytes(b)

    B = P.T.UPDATE_BEGIN
    add("update_begin_bad_mode", frame(B, patched(begin, 16, "<B", 3)), P.E.MALFORMED, "UPDATE_BEGIN mode 3")
    add("update_begin_mode_ff", frame(B, patched(begin, 16, "<B", 0xFF)), P.E.MALFORMED, "UPDATE_BEGIN mode 255")
    add("update_begin_reserved", frame(B, patched(begin, 18, "<B", 1)), P.E.MALFORMED,
        "UPDATE_BEGIN reserved byte 2 of 3 is 1")
    add("update_begin_bad_dtype", frame(B, patched(begin, dt0, "<B", 3)), P.E.MALFORMED, "tensor 0 dtype 3")
    add("update_begin_n_dims_0", frame(B, patched(begin, dt0 + 1, "<B", 0)), P.E.MALFORMED, "tensor 0 n_dims 0")
    add("update_begin_n_dims_5", frame(B, patched(begin, dt0 + 1, "<B", 5)), P.E.MALFORMED, "tensor 0 n_dims 5")
    add("update_begin_tensor_reserved", frame(B, patched(begin, dt0 + 2, "<H", 0x100)), P.E.MALFORMED,
        "tensor 0 flags u16 is 0x100 (no such bit)")
    add("update_begin_delta_v2", frame(B, valid_frames["update_begin_delta_v3"][16:], version=2), P.E.MALFORMED,
        "the version-3 delta manifest in a version-2 frame: DELTA is not defined there")
    add("update_begin_delta_v1", frame(B, patched(begin, dt0 + 2, "<H", 1)), P.E.MALFORMED,
        "a version-1 manifest whose tensor 0 has flags DELTA")
    add("update_begin_huge_tensor_count", frame(B, patched(begin, 36, "<I", 0xFFFFFFFF)), P.E.MALFORMED,
        "n_tensors = 2^32-1: refused before any allocation")
    n_fit = (len(begin) - 40) // 28
    add("update_begin_tensor_count_over_bytes", frame(B, patched(begin, 36, "<I", n_fit + 1)), P.E.MALFORMED,
        f"n_tensors = {n_fit + 1}: {n_fit + 1} x 28 bytes do not fit the {len(begin) - 40} bytes left")
    add("update_begin_one_tensor_too_many", frame(B, patched(begin, 36, "<I", 4)), P.E.MALFORMED,
        "n_tensors = 4 with 3 tensors in the body")
    add("update_begin_truncated", frame(B, begin[:-1]), P.E.MALFORMED, "the last tensor's crc32c cut by 1 byte")
    add("update_begin_trailing_byte", frame(B, begin + b"\0"), P.E.MALFORMED, "a byte after the last tensor")
    fixed = begin[:36] + struct.pack("<I", 1)
    tail = struct.pack("<BBHQQI", P.DTYPE_F32, 1, 0, 4, 16, 0)
    add("update_begin_empty_name", frame(B, fixed + struct.pack("<I", 0) + tail), P.E.MALFORMED,
        "a tensor with an empty name")
    add("update_begin_name_too_long", frame(B, fixed + struct.pack("<I", 257) + b"w" * 257 + tail), P.E.MALFORMED,
        "a tensor name of 257 bytes (the limit is 256)")
    add("update_begin_name_bad_utf8", frame(B, fixed + struct.pack("<I", 3) + b"a\xc0\x80" + tail), P.E.MALFORMED,
        "a tensor name with an overlong NUL")
    add("update_begin_name_huge", frame(B, fixed + struct.pack("<I", 0x7FFFFFFF) + tail), P.E.MALFORMED,
        "a tensor name claiming 2 GiB")
    add("update_begin_short", frame(B, begin[:39]), P.E.MALFORMED, "39 bytes: below the 40-byte minimum")

    chunk = valid_frames["update_chunk"][16:]
    C = P.T.UPDATE_CHUNK
    add("update_chunk_truncated_data", frame(C, chunk[:-1]), P.E.MALFORMED, "len says 68 bytes of data, 67 follow")
    add("update_chunk_len_huge", frame(C, patched(chunk, 28, "<I", 0xFFFFFFFF)), P.E.MALFORMED,
        "len = 2^32-1")
    add("update_chunk_trailing_byte", frame(C, patched(chunk, 28, "<I", len(chunk) - 33)), P.E.MALFORMED,
        "len one short of the data: a byte after the last field")
    add("update_chunk_ok_flags", frame(P.T.UPDATE_CHUNK_OK, patched(valid_frames["update_chunk_ok"][16:], 12, "<I", 2)),
        P.E.MALFORMED, "UPDATE_CHUNK_OK flags 2 (only DUPLICATE is defined)")
    add("update_commit_ok_reserved", frame(P.T.UPDATE_COMMIT_OK,
                                           patched(valid_frames["update_commit_ok"][16:], 36, "<I", 1)),
        P.E.MALFORMED, "UPDATE_COMMIT_OK reserved is 1")
    add("update_commit_trailing_byte", frame(P.T.UPDATE_COMMIT, valid_frames["update_commit"][16:] + b"\0"),
        P.E.MALFORMED, "UPDATE_COMMIT with 9 bytes")
    add("update_abort_short", frame(P.T.UPDATE_ABORT, valid_frames["update_abort"][16:23]), P.E.MALFORMED,
        "UPDATE_ABORT with 7 bytes")
    add("update_begin_ok_short", frame(P.T.UPDATE_BEGIN_OK, valid_frames["update_begin_ok"][16:-1]), P.E.MALFORMED,
        "UPDATE_BEGIN_OK with 31 bytes")
    bad = bytearray(valid_frames["update_begin_ok"][16:])
    bad[26] = 1
    add("update_begin_ok_reserved", frame(P.T.UPDATE_BEGIN_OK, bytes(bad)), P.E.MALFORMED,
        "UPDATE_BEGIN_OK with a reserved byte after data_port set")
    add("update_abort_ok_trailing", frame(P.T.UPDATE_ABORT_OK, valid_frames["update_abort_ok"][16:] + b"\0" * 8),
        P.E.MALFORMED, "UPDATE_ABORT_OK with 16 bytes")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "proto", "testdata"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    doc = {"magic": P.MAGIC.decode(), "version": P.VERSION, "version_min": P.VERSION_MIN,
           "default_max_len": P.DEFAULT_MAX_MESSAGE, "check_limits": "hello_ok.bin", "valid": [], "invalid": []}
    frames = {}
    limits = {"hello_ok.bin": LIMITS, "hello_ok_v2.bin": LIMITS_V2, "hello_ok_v3.bin": LIMITS_V3,
              "hello_ok_v4.bin": LIMITS_V4, "hello_ok_v5.bin": LIMITS_V5, "hello_ok_v6.bin": LIMITS_V6}
    for name, msg, desc, extra in valid_vectors():
        data = P.encode(msg, extra.get("version"))
        back = P.decode(data)
        assert P.encode(back) == data, name
        frames[name] = data
        entry = {"file": name + ".bin", "description": desc, "version": P.frame_version(data),
                 "message": P.to_json(back)}
        if "check" in extra:
            got = []
            if "check_limits" in extra:
                entry["check_limits"] = extra["check_limits"]
            for q in back.requests:
                try:
                    P.check_request(q, limits[extra.get("check_limits", doc["check_limits"])])
                    got.append(0)
                except P.ProtoError as e:
                    got.append(e.code)
            assert got == extra["check"], (name, got)
            entry["check_request"] = got
        doc["valid"].append(entry)
        with open(os.path.join(a.out, entry["file"]), "wb") as f:
            f.write(data)
    for name, data, code, desc, max_len in invalid_vectors(frames):
        try:
            P.decode(data, max_len)
            raise AssertionError(f"{name} decoded")
        except P.ProtoError as e:
            assert e.code == code, (name, e.code, code, e.message)
        doc["invalid"].append({"file": name + ".bin", "description": desc, "error": int(code),
                               "error_name": P.E(code).name, "max_len": max_len})
        with open(os.path.join(a.out, name + ".bin"), "wb") as f:
            f.write(data)
    with open(os.path.join(a.out, "vectors.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"gen_golden: {len(doc['valid'])} valid and {len(doc['invalid'])} invalid frames in {a.out}")


if __name__ == "__main__":
    main()
