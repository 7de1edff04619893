#!/usr/bin/env python3
"""Checks the include and call rules of docs/LAYOUT.md over the C sources of a tree.

  tools/check_layers.py [ROOT]     (default: the repository this file is in)

Four rules, each printed as a line per breach; the exit status is 1 when any
is broken, 0 otherwise:

  floor    a file includes only headers of its own floor or lower ones
           (FLOORS below); folders on one floor that must not see each other
           are listed in APART (the engine and the protocol);
  tools    nothing outside tools/ (and tests/) includes tools/;
  circle   no circle of modules: a module is a .c with its .h (x.c + x.h),
           and module a depends on b when a's .c or .h includes b.h. A private
           header (x_int.h, x_priv.h) belongs to module x;
  calls    no circle of files: file a uses file b when a's code names a
           function or global that b defines without static (a call, a
           function pointer taken, a variable read or written). Each strongly
           connected component of more than one file is one breach, within a
           folder or across folders, printed with one circle through it and
           the name each step uses. Files that share one header
           (daemon/api_int.h, engine/text/tokenizer_int.h) can call each other
           in a circle the module check cannot see.

tests/ may include anything (tests reach into internals on purpose) and is
left out of both circle checks.

The call graph is read from the sources with regexes, not from objects, so
that the check runs on any tree (tests/py/test_layers.py builds small ones)
and needs no build. What it sees and what it does not:
  - definitions: a function definition or a global variable at file scope in a
    .c/.cu/.cc file, unless static, extern or a typedef;
  - uses: every identifier of a source file's code and of its own #define
    bodies, after comments, strings and character constants are blanked,
    except members (after . or ->), function pointers being declared
    ((*name)), file-scope declarations that define nothing (prototypes,
    externs, typedefs) and names the file defines itself;
  - a name defined in several files (programs of tools/ each with a main) is
    resolved to the user's own definition if it has one, else to all of them;
  - not seen: calls made in a header's macros or static inline functions
    (they belong to whoever includes it; the module check covers headers),
    functions defined by macros, and calls through pointers a file was given
    (a callback is no edge: that is how a lower file calls back up). A local
    variable or member declared with an external function's name is taken
    for a use: a false edge, never a missed one."""
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


CODE_SOURCE = re.compile(r"\.(c|cu|cc)$")
IDENT = re.compile(r"\b[A-Za-z_]\w*")   # not the x of 0x1f or the ull of 10ull
KEYWORDS = set("""auto break case char const continue default do double else enum extern float for goto if
inline int long register restrict return short signed sizeof static struct switch typedef union unsigned
void volatile while _Alignas _Alignof _Atomic _Bool _Generic _Noreturn _Static_assert _Thread_local
__attribute__ __restrict __inline __typeof__ typeof asm __asm__ __extension__ __device__ __global__
__host__ __shared__ __constant__ __forceinline__ __launch_bounds__ template typename namespace using class
public private protected constexpr operator new delete this""".split())


def blank(text):
    """text with comments, string literals and character constants replaced by spaces (newlines
    kept), then split into the code and the bodies of its #define lines (other directives dropped)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c if j - i >= 2 else " ")
            i = j
        else:
            out.append(c)
            i += 1
    code, macros = [], []
    lines = "".join(out).replace("\\\n", "  ").split("\n")
    for line in lines:
        m = re.match(r"\s*#\s*(\w*)(.*)", line)
        if m:
            if m.group(1) == "define":
                # the macro's name (and its parameters) are no use of anything
                macros.append(re.sub(r"^\s*\w+(\([^)]*\))?", "", m.group(2)))
            code.append("")
        else:
            code.append(line)
    return "\n".join(code), "\n".join(macros)


def declared_names(decl):
    """The names a file-scope declaration (without its ';') defines: none for a prototype, a typedef,
    an extern or a static; a body of a struct, union or enum is already cut out ({} left)."""
    words = set(IDENT.findall(decl))
    if words & {"typedef", "extern", "static"}:
        return []
    names = []
    for part in split_top(decl, ","):
        part = split_top(part, "=")[0]
        fp = re.search(r"\(\s*\*\s*([A-Za-z_]\w*)\s*\)", part)
        if fp:                                  # a function pointer: void (*hook)(int)
            names.append(fp.group(1))
        elif "(" in part:                       # a prototype, or a macro call at file scope
            continue
        else:
            part = re.sub(r"\[[^\]]*\]", "", part)
            ids = [x for x in IDENT.findall(part) if x not in KEYWORDS]
            if ids and part.strip() != "{}" and not part.rstrip().endswith("{}"):
                names.append(ids[-1])
    return names


def split_top(text, sep):
    """text split at sep outside (), [] and {}."""
    parts, depth, cur = [], 0, []
    for c in text:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    parts.append("".join(cur))
    return parts


def file_scope(code):
    """(names, code_for_uses): the functions and globals code defines with external linkage, and
    code with its file-scope declarations that define nothing blanked (prototypes, externs,
    typedefs: naming a function is not using it; the use is where it is called or taken)."""
    names, chunk, start, i, n = [], [], 0, 0, len(code)
    out = list(code)
    while i < n:
        c = code[i]
        if c == "{":
            head = "".join(chunk)
            # the matching }
            depth, j = 1, i + 1
            while j < n and depth:
                if code[j] == "{":
                    depth += 1
                elif code[j] == "}":
                    depth -= 1
                j += 1
            fn = function_name(head)
            if fn is not None:
                # a function definition ends at its }
                if fn and not re.search(r"\bstatic\b", head):
                    names.append(fn)
                chunk, start = [], j
            else:
                chunk.append("{}")              # an initializer or a struct body: the declaration goes on
            i = j
        elif c == ";":
            decl = "".join(chunk)
            names += declared_names(decl)
            words = set(IDENT.findall(decl))
            pure = "{}" not in decl and not split_top(decl, "=")[1:]
            if pure and (words & {"extern", "typedef"} or (re.search(r"\w\s*\(", decl) and
                                                         not re.search(r"\(\s*\*", decl))):
                for k in range(start, i):
                    if out[k] != "\n":
                        out[k] = " "
            chunk, start = [], i + 1
            i += 1
        else:
            chunk.append(c)
            i += 1
    return names, "".join(out)


def function_name(head):
    """The name head defines when a { after it opens a function body ('' for one not to count), or
    None when the { opens an initializer or a struct, union or enum body."""
    h = head.rstrip()
    if split_top(h, "=")[1:] or not h.endswith(")"):
        return None
    # h ends with a parameter list (maybe after attributes): the identifier before the first
    # top-level ( is the function's name, unless it is a function pointer's declarator
    depth = 0
    for k, c in enumerate(h):
        if c == "(":
            if depth == 0:
                before = IDENT.findall(h[:k])
                if not before:
                    return ""
                name = before[-1]
                if name not in ("__attribute__", "__declspec", "alignas", "_Alignas"):
                    return "" if name in KEYWORDS else name
            depth += 1                          # inside an attribute's parentheses (or deeper)
        elif c == ")":
            depth -= 1
    return ""


def uses(code, macros):
    """Identifiers code and its macros name, except members (after . or ->) and function
    pointers being declared ((*name), a member's or a variable's)."""
    out = set()
    for text in (code, macros):
        for m in IDENT.finditer(text):
            before = text[max(0, m.start() - 8):m.start()].rstrip()
            if before.endswith(".") or before.endswith("->"):
                continue
            if re.search(r"\(\s*\*$", before) and re.match(r"\s*\)", text[m.end():]):
                continue
            out.add(m.group(0))
    return out - KEYWORDS


def call_graph(root, files):
    """file -> {file it uses: a name it uses there}, over the code files (not tests/)."""
    defs, used = {}, {}
    for path in files:
        if top(path) == "tests" or not CODE_SOURCE.search(path):
            continue
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            code, macros = blank(f.read())
        names, code = file_scope(code)
        own = set(names)
        for name in own:
            defs.setdefault(name, []).append(path)
        used[path] = (uses(code, macros), own)
    graph = {}
    for path, (names, own) in used.items():
        for name in sorted(names - own):
            for dst in defs.get(name, ()):
                graph.setdefault(path, {}).setdefault(dst, name)
    return graph


def witness(graph, comp):
    """One circle through comp's first file, as 'a -> b (name) -> ... -> a (name)'."""
    start, inside = comp[0], set(comp)
    prev, queue = {start: None}, [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph.get(v, {})):
            if w == start:
                path, x = [(start, graph[v][w])], v
                while x != start:
                    path.append((x, graph[prev[x]][x]))
                    x = prev[x]
                return start + "".join(" -> %s (%s)" % (f, name) for f, name in reversed(path))
            if w in inside and w not in prev:
                prev[w] = v
                queue.append(w)
    return start


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
    calls = call_graph(root, files)
    for comp in find_circles(calls):
        breaches.append("calls   %s: these files call each other in a circle, e.g. %s"
                        % (", ".join(comp), witness(calls, comp)))
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
