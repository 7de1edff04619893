"""The include rules of docs/LAYOUT.md (tools/check_layers.py): the tree keeps
them, and the checker fails on each kind of breach, shown on small trees that
break one rule each (and pass once the breach is mended)."""
import os
import tempfile

from harness import ROOT, TMP, case, main, run

CHECK = os.path.join(ROOT, "tools", "check_layers.py")


def tree(files):
    """A throwaway tree of C files: {path: text}."""
    root = tempfile.mkdtemp(dir=TMP)
    for path, text in files.items():
        os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
        with open(os.path.join(root, path), "w") as f:
            f.write(text)
    return root


def breaches(root):
    p = run(["python3", CHECK, root], check=False)
    lines = [l for l in p.stdout.splitlines() if not l.startswith("layers:")]
    return p.returncode, lines


GOOD = {
    "base/err.h": "",
    "engine/serve/kv.h": '#include "base/err.h"\n',
    "engine/serve/kv.c": '#include "engine/serve/kv.h"\n',
    "proto/proto.h": '#include "base/err.h"\n',
    "daemon/loop.c": '#include "engine/serve/kv.h"\n#include "proto/proto.h"\n',
    "tools/cli.h": "",
    "tools/ctl.c": '#include "tools/cli.h"\n#include "daemon/loop.h"\n',
    "tests/unit/t.c": '#include "tools/cli.h"\n#include "daemon/loop.c"\n',
}


@case
def tree_keeps_the_rules():
    rc, lines = breaches(ROOT)
    assert rc == 0 and not lines, "\n".join(lines)


@case
def a_good_tree_passes():
    rc, lines = breaches(tree(GOOD))
    assert rc == 0 and not lines, lines


@case
def engine_including_the_daemon_fails():
    rc, lines = breaches(tree(dict(GOOD, **{"engine/serve/kv.c": '#include "daemon/loop.h"\n'})))
    assert rc == 1 and len(lines) == 1 and lines[0].startswith("floor") and "engine/serve/kv.c" in lines[0], lines


@case
def daemon_including_tools_fails():
    rc, lines = breaches(tree(dict(GOOD, **{"daemon/loop.c": '#include "tools/cli.h"\n'})))
    kinds = sorted(l.split()[0] for l in lines)
    assert rc == 1 and kinds == ["floor", "tools"], lines


@case
def engine_and_proto_apart():
    rc, lines = breaches(tree(dict(GOOD, **{"proto/proto.h": '#include "engine/serve/kv.h"\n'})))
    assert rc == 1 and len(lines) == 1 and "share a floor" in lines[0], lines


@case
def a_circle_of_modules_fails():
    files = dict(GOOD)
    files.update({
        "daemon/update.h": "",
        "daemon/update.c": '#include "daemon/update.h"\n#include "daemon/reply.h"\n',
        "daemon/reply.h": "",
        "daemon/reply.c": '#include "daemon/reply.h"\n#include "daemon/update.h"\n',
    })
    rc, lines = breaches(tree(files))
    assert rc == 1 and len(lines) == 1 and lines[0].startswith("circle"), lines
    assert "daemon/reply" in lines[0] and "daemon/update" in lines[0], lines


@case
def a_private_header_is_its_module():
    files = dict(GOOD)
    files.update({
        "client/push.h": "",
        "client/push_priv.h": '#include "client/push.h"\n',
        "client/push.c": '#include "client/push_priv.h"\n',
        "client/chain.c": '#include "client/push_priv.h"\n',
    })
    rc, lines = breaches(tree(files))
    assert rc == 0 and not lines, lines


# Two files that share one header and call each other: the module check cannot see it (one header,
# no circle of includes), the calls rule does.
CALL_CIRCLE = {
    "daemon/api.h": "int api_route(void);\nint api_answer(void);\n",
    "daemon/api.c": '#include "daemon/api.h"\n'
                    "int api_answer(void) { return 200; }\n"
                    "int api_table(void) { return api_route(); }\n",
    "daemon/api_route.c": '#include "daemon/api.h"\nint api_route(void) { return api_answer(); }\n',
}


@case
def a_circle_of_calls_fails():
    rc, lines = breaches(tree(dict(GOOD, **CALL_CIRCLE)))
    assert rc == 1 and len(lines) == 1 and lines[0].startswith("calls"), lines
    assert "daemon/api.c" in lines[0] and "daemon/api_route.c" in lines[0], lines
    assert "(api_route)" in lines[0] and "(api_answer)" in lines[0], lines   # the witness names a call each way


@case
def the_circle_broken_by_moving_the_helper_down_passes():
    files = dict(GOOD, **CALL_CIRCLE)
    files["daemon/api.c"] = '#include "daemon/api.h"\nint api_table(void) { return api_route(); }\n'
    files["daemon/api_answer.c"] = '#include "daemon/api.h"\nint api_answer(void) { return 200; }\n'
    rc, lines = breaches(tree(files))
    assert rc == 0 and not lines, lines


@case
def calls_across_folders_and_through_a_table_fail():
    """A circle counts across folders (engine/format -> engine/model -> engine/format), and a
    global's use (a table of function pointers, a variable) is an edge like a call."""
    files = dict(GOOD)
    files.update({
        "engine/format/gguf.h": "extern const int ggml_sizes[];\nint dq_row(int t);\nint gguf_open(void);\n",
        "engine/format/gguf.c": '#include "engine/format/gguf.h"\nint gguf_open(void) { return dq_row(1); }\n',
        "engine/model/dequant.c": '#include "engine/format/gguf.h"\n'
                                  "const int ggml_sizes[] = {4, 2};\n"
                                  "static int (*const rows[])(void) = {gguf_open};\n"
                                  "int dq_row(int t) { return ggml_sizes[t] + rows[0](); }\n",
    })
    rc, lines = breaches(tree(files))
    assert rc == 1 and len(lines) == 1 and lines[0].startswith("calls"), lines
    assert "engine/format/gguf.c" in lines[0] and "engine/model/dequant.c" in lines[0], lines


@case
def what_is_not_a_call_passes():
    """Statics, prototypes, comments, strings, struct members and names a file defines itself
    make no edge; tests/ is left out."""
    files = dict(GOOD)
    files.update({
        "client/push.h": "int push_go(void);\nstruct ops { int (*chain_run)(void); };\n",
        "client/push.c": '#include "client/push.h"\n'
                         "int chain_run(void);  /* a prototype: chain_run is chain.c's */\n"
                         "int push_go(void) { return 0; }\n",
        "client/chain.c": '#include "client/push.h"\n'
                          "static int push_go_twice(void) { return push_go() + push_go(); }\n"
                          "int chain_run(void) { return push_go_twice(); }\n",
        "client/other.c": '#include "client/push.h"\n'
                          "/* chain_run() is not called here */\n"
                          'static const char *why = "chain_run";\n'
                          "static int chain_run_ops(struct ops *o) { return o->chain_run() + (why != 0); }\n"
                          "int push_go_more(struct ops o) { return o.chain_run() + chain_run_ops(&o); }\n",
        "tests/unit/t2.c": '#include "client/push.h"\nint push_go_more(void) { return chain_run(); }\n',
    })
    # push.c -> nothing of chain.c (a prototype is no use); chain.c -> push.c; other.c -> neither
    files["client/push.c"] += "int push_more(void) { return push_go(); }\n"
    rc, lines = breaches(tree(files))
    assert rc == 0 and not lines, lines
    files["client/push.c"] += "int push_chain(void) { return chain_run(); }\n"   # now a real call back
    rc, lines = breaches(tree(files))
    assert rc == 1 and len(lines) == 1 and "client/chain.c, client/push.c" in lines[0], lines


main()
