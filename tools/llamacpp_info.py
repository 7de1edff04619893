"""Which llama.cpp the oracles and benchmarks ran: the llama-cpp-python version, the CMAKE_ARGS
tools/setup.sh built it with (the stamp it writes next to the package), llama.cpp's own CPU
feature line, and the buffer types each model's weights were loaded into.

The buffer types come from llama.cpp's load log ("CPU_REPACK model buffer size = ..."): they say
whether its repacked kernels (CPU_REPACK) or the AMX path (AMX) hold the weights, which is what
decides both its speed and whether it crashes on an AMX host (issue 25). The log is read through
llama.cpp's log callback while a model loads and passed on to llama-cpp-python's own callback, so
verbose=True still prints it.

    import llamacpp_info
    llm = llamacpp_info.Llama(model_path=..., **kw)     # prints one "llama.cpp: ..." line
    with llamacpp_info.capture() as bufs:                # the low-level API (bench_llamacpp.py)
        model = llama_cpp.llama_model_load_from_file(...)
    print(llamacpp_info.describe(path, bufs))
"""
import contextlib
import ctypes
import os
import re
import sys

_BUFFER_LINE = re.compile(rb"(\S+) model buffer size\s*=\s*([0-9.]+) MiB")
_printed_build = False


def build():
    """One line: the package version, its CMAKE_ARGS stamp, llama.cpp's CPU features."""
    import llama_cpp
    stamp = os.path.join(os.path.dirname(llama_cpp.__file__), "rolloutd-cmake-args")
    try:
        with open(stamp) as f:
            args = f.read().strip()
    except OSError:
        args = "unknown (no tools/setup.sh stamp: built some other way)"
    feats = llama_cpp.llama_print_system_info().decode(errors="replace").strip().rstrip("|").strip()
    return f"llama-cpp-python {llama_cpp.__version__}, CMAKE_ARGS {args}; {feats}"


@contextlib.contextmanager
def capture():
    """Collects [(buffer type, MiB)] from the model loads inside the block."""
    import llama_cpp
    import llama_cpp._logger as pylog
    seen = []

    @llama_cpp.llama_log_callback
    def hook(level, text, user_data):
        m = _BUFFER_LINE.search(text or b"")
        if m:
            seen.append((m.group(1).decode(errors="replace"), float(m.group(2))))
        pylog.llama_log_callback(level, text, user_data)

    llama_cpp.llama_log_set(hook, ctypes.c_void_p(0))
    try:
        yield seen
    finally:
        llama_cpp.llama_log_set(pylog.llama_log_callback, ctypes.c_void_p(0))


def describe(path, bufs):
    """'llama.cpp: <build>' the first time, then '<file>: weights in CPU_REPACK 12.0 MiB + ...'."""
    global _printed_build
    lines = []
    if not _printed_build:
        lines.append(f"llama.cpp: {build()}")
        _printed_build = True
    held = " + ".join(f"{name} {mib:.1f} MiB" for name, mib in bufs) or "no buffer lines logged"
    lines.append(f"llama.cpp: {os.path.basename(str(path))}: weights in {held}")
    return "\n".join(lines)


def Llama(model_path, **kw):
    """llama_cpp.Llama(model_path, **kw), printing the build and the weights' buffer types.

    RD_LLAMA_THREADS, where set, replaces n_threads and n_threads_batch: tests/run.sh sets 1 when
    it runs test files side by side, because llama.cpp's threads spin at every barrier, and a spinning
    thread whose partner lost its core to the other file's work only burns that core (an oracle
    file took 2.4x its time alone). Its logits do not depend on the thread count."""
    import llama_cpp
    cap = os.environ.get("RD_LLAMA_THREADS")
    if cap:
        kw["n_threads"] = kw["n_threads_batch"] = int(cap)
    with capture() as bufs:
        llm = llama_cpp.Llama(model_path=model_path, **kw)
    if not kw.get("vocab_only"):
        print(describe(model_path, bufs), file=sys.stdout, flush=True)
    return llm
