"""The include rules of docs/LAYOUT.md (tools/check_layers.py): the tree keeps
them, and the checker fails on each kind of breach, shown on small trees that
break one rule each."""
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


main()
