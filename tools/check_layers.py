#!/usr/bin/env python3
"""Checks the include rules of docs/LAYOUT.md over the C sources of a tree.

  tools/check_layers.py [ROOT]     (default: the repository this file is in)

Three rules, each printed as a line per breach; the exit status is 1 when any
is broken, 0 otherwise:

  floor    a file includes only headers of its own floor or lower ones
           (FLOORS below); folders on one floor that must not see each other
           are listed in APART (the engine and the protocol);
  tools    nothing outside tools/ (and tests/) includes tools/;
  circle   no circle of modules: a module is a .c with its .h (x.c + x.h),
           and module a depends on b when a's .c or .h includes b.h. A circle
           of calls shows up here as long as each module declares its own
           functions in its own header, which is the house rule. A private
           header (x_int.h, x_priv.h) belongs to module x.

tests/ may include anything (tests reach into internals on purpose) and is
left out of the circle check."""
import os
import re
import sys

# Floor of each top-level folder (a sub-folder of engine/ is the engine).
FLOORS = {
    "base": 0,
    "engine": 1,
    "proto": 1,
    "kernels": 2,
    "client": 3,
    "daemon": 4,
    "tools": 5,
}
# Same floor, but neither includes the other.
APART = {("engine", "proto"), ("proto", "engine")}
SOURCE = re.compile(r"\.(c|h|cu|cc)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def top(path):
    return path.split("/", 1)[0]


def sources(root):
    out = []
    for d in list(FLOORS) + ["tests"]:
        base = os.path.join(root, d)
        for dirpath, dirnames, files in os.walk(base):
            dirnames[:] = [x for x in dirnames if x not in ("testdata", "__pycache__")]
            for f in files:
                if SOURCE.search(f):
                    out.append(os.path.relpath(os.path.join(dirpath, f), root))
    return sorted(out)


def includes(root, path):
    with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
        return INCLUDE.findall(f.read())


def module(path):
    """x.c, x.h and x's private header (x_int.h, x_priv.h) are one module."""
    return re.sub(r"_(int|priv)$", "", re.sub(SOURCE, "", path))


def find_circles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def check(root):
    breaches = []
    graph = {}
    files = sources(root)
    present = set(files)
    for path in files:
        src = top(path)
        for inc in includes(root, path):
            dst = top(inc)
            if src != "tests" and dst == "tools" and src != "tools":
                breaches.append("tools   %s includes %s: only tools/ may include tools/" % (path, inc))
            if src in FLOORS and dst in FLOORS:
                if FLOORS[dst] > FLOORS[src]:
                    breaches.append("floor   %s (%s, floor %d) includes %s (%s, floor %d): a floor includes only "
                                    "its own or lower ones" % (path, src, FLOORS[src], inc, dst, FLOORS[dst]))
                elif (src, dst) in APART:
                    breaches.append("floor   %s includes %s: %s/ and %s/ share a floor and must not include each "
                                    "other" % (path, inc, src, dst))
            if src != "tests" and inc in present and module(inc) != module(path):
                graph.setdefault(module(path), set()).add(module(inc))
    for comp in find_circles(graph):
        breaches.append("circle  " + " -> ".join(comp) + ": these modules include each other in a circle")
    return breaches, len(files)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    breaches, n = check(root)
    for b in breaches:
        print(b)
    print("layers: %d files, %d breaches" % (n, len(breaches)))
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main())
