"""The SentencePiece-style tokenizer (tokenizer.ggml.model "llama") against
llama.cpp (llama-cpp-python, vocab only) on the real Gemma 3 file.

Our ids come from build/rollout-tokenize, which reads only the file's metadata
(gguf_open + tok_load), so the model's tensor types do not matter here. Every
string is compared with and without special-token parsing; decode(encode(s))
== s is checked for all of them, and our decode of each id against llama.cpp's
token_to_piece. The chat prompt is compared with llama.cpp's tokenization of
the rendered text (Hugging Face's Gemma 3 template). The add_space_prefix =
true path (Llama 2 style) is compared on a vocab-only copy of the same file
with that key set.

The file is RD_GEMMA_MODEL, else models/gemma-3-270m-q4_k_m.gguf (make
model-gemma3). Without it every case prints a SKIP line.
"""
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, ROOT, TMP, main, run  # noqa: E402
import harness  # noqa: E402

TOOL = os.path.join(BUILD, "rollout-tokenize")
GEMMA = os.environ.get("RD_GEMMA_MODEL") or os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf")

_skipped = []


def case(fn):
    """harness.case, but a SKIP line instead when the Gemma file is absent."""
    if os.path.exists(GEMMA):
        return harness.case(fn)
    _skipped.append(fn.__name__)
    return fn


# Gemma 3's ids (tokenizer.ggml.*; the file says bos 2, eos 1, pad 0, unk 3).
PAD, EOS, BOS, UNK = 0, 1, 2, 3
START_OF_TURN, END_OF_TURN = 105, 106

PROSE = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! How are you doing today?",
    " leading space",
    "  two leading spaces",
    "trailing space ",
    "UPPER CASE WORDS AND MiXeD cAsE, CamelCaseIdentifier snake_case_name",
    "e-mail: someone@example.com, url: https://example.org/path?q=1&r=2#frag",
    "I'm sure you're right, it's what we've said and they'll do it.",
    "Reinforcement learning from verifiable rewards samples many rollouts per prompt.",
    "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
]
DIGITS = [
    "12345",
    "3.14159265358979323846",
    "In 2024, 1,234,567 people paid $89.99 each.",
    "0000000000000000000000000000000012",
    "a1b2c3 x99 v2.0.1 1st 2nd 3rd",
    "\u0661\u0662\u0663 \u0664\u0665\u0666 Arabic-Indic digits, \u00bd \u00b2 \u216b \u2460",
    "9" * 50 + "1234567890" * 10,
]
# Runs of spaces, tabs and newlines are user-defined tokens in Gemma's vocab
# (up to 31 of each), matched before the merges whatever the flag.
WHITESPACE = [
    "a  b   c    d     e",
    "tab\tseparated\tvalues\t",
    "line one\nline two\n\nline four",
    "\n", "\n\n\n", " ", "   ", "\t", "\t\t\t\t",
    "\t\t  \n \r\n mixed",
    "ends with newline and spaces \n  ",
    "\u00a0non-breaking\u00a0space and\u2003em space and\u3000ideographic",
    "\r\n\r\n windows line endings\r\n",
    " \n", "\n ", "a \tb\t c",
    "x" + " " * 40 + "y",
    "y" + "\n" * 45 + "z",
    "\t" * 33 + "deep",
    " " * 31, " " * 32, " " * 62 + "x",
    "  \n  \n  \t \t",
]
UNICODE = [
    "Caf\u00e9, na\u00efve, r\u00e9sum\u00e9, Z\u00fcrich, S\u00e3o Paulo, \u00c5ngstr\u00f6m",
    "e\u0301 decomposed accent, n\u0303",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3092\u5206\u5272\u3057\u307e\u3059\u3002",
    "\u4e2d\u6587\u6587\u672c\u6d4b\u8bd5\uff0c\u5305\u62ec\u6807\u70b9\u7b26\u53f7\uff01",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\ub3c4 \uc788\uc2b5\ub2c8\ub2e4",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u041a\u0430\u043a \u0434\u0435\u043b\u0430?",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u03b3\u03c1\u03ac\u03bc\u03bc\u03b1\u03c4\u03b1",
    "\u05e2\u05d1\u05e8\u05d9\u05ea \u0939\u093f\u0928\u094d\u0926\u0940 \u092a\u093e\u0920",
    "\u0e44\u0e17\u0e22 \u0e20\u0e32\u0e29\u0e32 \u1780\u17d2\u1798\u17c2\u179a",
    "\U0001d518\U0001d52b\U0001d526\U0001d520\U0001d52c\U0001d521\U0001d522 math letters",
    "a\u200bb zero width space, soft\u00adhyphen, \ufeffBOM",
    "\u00ff\u00fe\u0100\u0101 \u0120 \u0121 latin-1 edges",
    "\u1e9e\u00df \u0130\u0131 \u01c5 \u1f88 case oddities",
]
EMOJI = [
    "I love \U0001f355 and \U0001f389!",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 family ZWJ sequence",
    "\U0001f44d\U0001f3fd skin tone, \U0001f3f3\ufe0f\u200d\U0001f308 flag, \u2764\ufe0f heart",
    "\U0001f1eb\U0001f1f7\U0001f1e9\U0001f1ea flags",
    "\U0001f600" * 20,
    "\U0001fae8\U0001faaf\U0001fabc newer emoji",
]
# Characters that are unlikely to be tokens: rare CJK (extension B and later),
# private-use code points, noncharacters, C0/C1 controls, unassigned ones.
# Those with no token go out as their bytes (<0xXX>).
BYTE_FALLBACK = [
    "\U00020000\U0002a6d6\U0002b740\U00030000 CJK extensions",
    "rare \u9fff\u4dbf\u3400 CJK",
    "\ue000\uf8ff private use, \U000f0000\U0010fffd planes 15-16",
    "\uffff\ufffe\ufdd0 noncharacters",
    "\x01\x02\x7f\x1b[0m controls \u0080\u009f",
    "\u0378\u0379 unassigned, \U000e0001 tag",
    "\x00 NUL inside",
    "a\U00020000b\ue000c",
    "\U0001f9ff\U0001fa70\U00013000 \U00011000",
]
CODE = [
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}",
    '{"key": "value", "list": [1, 2, 3], "nested": {"a": null}}',
    '<div class="x">&amp; &lt;tag&gt;</div>',
    "    indented = True\n        more_indented()\n",
    "$ ls -la | grep '.txt' > out.log 2>&1",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }\n",
    "| a | b |\n|---|---|\n| 1 | 2 |\n",
    "```python\nprint('hi')\n```",
    "a" * 70,
]
# Control tokens (<start_of_turn>, <bos>, <unusedN>, ...) count only with
# special parsing; user-defined ones (HTML tags, [multimodal], <start_of_image>,
# whitespace runs) always.
SPECIAL = [
    "<start_of_turn>user\nHello!<end_of_turn>\n<start_of_turn>model\n",
    "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>", "<unk>", "<mask>",
    "<bos>Hello", "text<end_of_turn>more text", "<start_of_turn><end_of_turn><start_of_turn>",
    "<unused0> <unused99> <unused6241> <unused6242>",
    "<start_of_turn > not special, <start_of_turn x, < start_of_turn>",
    "<<start_of_turn>>", "<start_of_turn<end_of_turn>>",
    "[multimodal] <start_of_image><end_of_image>",
    "<b>bold</b> <i>it</i> <table><tr><td>1</td></tr></table>",
    "<h1>Title</h1><blockquote>q</blockquote> <s>x</s> <code>c</code>",
    "before <eos> after",
    "  <end_of_turn>  ",
    "\n<start_of_turn>\n\n<end_of_turn>\n\n\n",
]
EDGE = [
    "",
    "\u2581 a literal lower one-eighth block \u2581\u2581x",
    "\u4e00" * 1500,
]


def long_text():
    """About 5 KB of everything above, shuffled reproducibly."""
    rng = random.Random(1234)
    pool = PROSE + DIGITS[:5] + WHITESPACE + UNICODE + EMOJI + BYTE_FALLBACK + CODE + SPECIAL
    parts, size = [], 0
    while size < 5000:
        s = rng.choice(pool)
        parts.append(s)
        size += len(s.encode()) + 1
    return " ".join(parts)


def random_texts(n=150):
    """Random mixes of characters where the rules meet: spaces (U+2581),
    whitespace runs, specials, byte-fallback characters."""
    rng = random.Random(42)
    alphabet = (list("abcXYZ  \t\n'!?.,-_0123456789<>/") +
                ["  ", "\r\n", "\n\n", "\u00e9", "\u4e2d", "\U0001f600", "\u0663", "\u00a0", "\u200d", "\u0301",
                 "<start_of_turn>", "<end_of_turn>", "<b>", "<unused7>", "\U00020000", "\ue000", "\u2581",
                 " the", "ing", "tion"])
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(n)]


STRINGS = PROSE + DIGITS + WHITESPACE + UNICODE + EMOJI + BYTE_FALLBACK + CODE + SPECIAL + EDGE + [long_text()]


def hexline(t):
    return (t.encode("utf-8", "surrogatepass") if isinstance(t, str) else t).hex()


def encode(texts, special, model=None, mode=None):
    """Our ids for each text (or "error: ..."), and the tool's exit status.
    mode: None (encode, --special if special), "--prompt" or "--chat" (each
    text then a (system or None, user) pair)."""
    args = [TOOL, "--model", model or GEMMA] + ([mode] if mode else ["--special"] if special else [])
    if mode == "--chat":
        inp = "".join((hexline(s) + ":" if s is not None else "") + hexline(u) + "\n" for s, u in texts)
    else:
        inp = "".join(hexline(t) + "\n" for t in texts)
    p = run(args, input=inp, check=False)
    lines = p.stdout.split("\n")[:-1]
    assert len(lines) == len(texts), f"{len(texts)} inputs gave {len(lines)} lines; stderr: {p.stderr[-500:]}"
    return [line if line.startswith("error:") else [int(x) for x in line.split(",")] if line else []
            for line in lines], p.returncode


def decode(id_lists, model=None):
    p = run([TOOL, "--model", model or GEMMA, "--decode"],
            input="".join(",".join(map(str, ids)) + "\n" for ids in id_lists))
    lines = p.stdout.split("\n")[:-1]
    assert len(lines) == len(id_lists)
    return [bytes.fromhex(line) for line in lines]


def quiet(fn):
    """fn() with fd 2 sent to /dev/null: llama.cpp warns there even with verbose=False."""
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        return fn()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


_llama = {}


def llama(model=None):
    model = model or GEMMA
    if model not in _llama:
        try:
            import llama_cpp
        except ImportError as e:
            raise AssertionError("the oracle llama_cpp (llama-cpp-python) is not importable; run `make setup`") from e
        _llama[model] = quiet(lambda: llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False))
    return _llama[model]


def piece(ref, tok):
    """llama.cpp's token_to_piece(special=True, lstrip=0), with a buffer large
    enough for any token (Llama.detokenize's 32 bytes are not)."""
    import ctypes
    import llama_cpp
    buf = ctypes.create_string_buffer(512)
    n = llama_cpp.llama_token_to_piece(ref._model.vocab, tok, buf, 512, 0, True)
    assert 0 <= n <= 512, (tok, n)
    return buf.raw[:n]


# llama.cpp's load marks tokens with certain texts as control whatever the
# file says (its end-of-generation list, src/llama-vocab.cpp): in Gemma 3 that
# hits "</s>" (id 212), a user-defined token (an HTML close tag, like "<s>" 203)
# in the file. We keep the file's type, as SentencePiece and Hugging Face do:
# "</s>" in text is token 212 with or without special parsing, where
# llama.cpp, without it, spells the tag out. The oracle for such text is
# llama.cpp on the pieces around each "</s>", joined by 212.
OVERRIDDEN = {"</s>": 212}


def llama_ids(ref, text, special, add_bos=False):
    """llama.cpp's tokenize, with OVERRIDDEN tokens kept user-defined."""
    if not special:
        for tok_text, tok_id in OVERRIDDEN.items():
            if tok_text in text:
                parts = [llama_ids(ref, part, special) for part in text.split(tok_text)]
                ids = [BOS] if add_bos else []
                for i, part in enumerate(parts):
                    ids += ([tok_id] if i else []) + part
                return ids
    return ref.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)


def show(ids, at):
    lo = max(0, at - 4)
    return ("..." if lo else "") + str(ids[lo:at + 6])[1:-1] + ("..." if at + 6 < len(ids) else "")


def compare(texts, special, model=None):
    ours, rc = encode(texts, special, model)
    ref = llama(model)
    bad = []
    for text, got in zip(texts, ours):
        want = llama_ids(ref, text, special)
        if got != want:
            at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want))) \
                if isinstance(got, list) else 0
            bad.append((text, got, want, at))
    for text, got, want, at in bad:
        print(f"mismatch special={special} text={text!r}\n  ours:      {got}\n  llama.cpp: {want}")
    if bad:
        head = "; ".join(f"{t[:60]!r}: first difference at {at}: ours [{show(g, at) if isinstance(g, list) else g}]"
                         f" llama.cpp [{show(w, at)}]" for t, g, w, at in bad[:4])
        raise AssertionError(f"{len(bad)} of {len(texts)} strings differ from llama.cpp (special={special}, "
                             f"{os.path.basename(model or GEMMA)}): {head}")
    assert rc == 0, f"rollout-tokenize exited {rc}"
    return len(texts)


@case
def test_gemma_info():
    p = run([TOOL, "--model", GEMMA, "--info"])
    info = dict(line.split(" ", 1) for line in p.stdout.splitlines())
    want = {"vocab": "262144", "bos": str(BOS), "eos": str(EOS), "eot": str(END_OF_TURN), "add_bos": "1",
            "chat": "gemma"}
    assert info == {**info, **want}, info
    ref = llama()
    assert (ref.token_bos(), ref.token_eos(), ref.n_vocab()) == (BOS, EOS, 262144)


@case
def test_gemma_matches_llama_cpp_plain():
    assert len(STRINGS) >= 100, len(STRINGS)
    compare(STRINGS, special=False)


@case
def test_gemma_matches_llama_cpp_special():
    compare(STRINGS, special=True)


@case
def test_gemma_matches_llama_cpp_random_mixes():
    texts = random_texts()
    compare(texts, special=False)
    compare(texts, special=True)


@case
def test_gemma_known_ids():
    """Ids that show the rules: a space is U+2581 glued to the next word, no
    space prefix in Gemma 3, whitespace runs and HTML tags are user-defined
    tokens, a character with no token is its UTF-8 bytes as <0xXX>."""
    (hello, lead, spaces, tag, rare, turn_off), _ = encode(
        ["Hello world", " Hello", "a   b", "<b>", "\U00020000", "<start_of_turn>"], False)
    (turn_on,), _ = encode(["<start_of_turn>"], True)
    ref = llama()
    vocab = ref._model.vocab
    import llama_cpp

    def text(i):
        return llama_cpp.llama_vocab_get_text(vocab, i).decode()
    assert hello == [9259, 1902] and text(1902) == "\u2581world", hello
    assert len(lead) == 1 and text(lead[0]) == "\u2581Hello", lead
    assert spaces[1] == 139 and text(139) == "   ", spaces  # the 3-space user-defined token
    assert tag == [200], tag
    assert [text(i) for i in rare] == ["<0xF0>", "<0xA0>", "<0x80>", "<0x80>"], rare
    assert turn_on == [START_OF_TURN] and START_OF_TURN not in turn_off and len(turn_off) > 1, (turn_on, turn_off)


@case
def test_gemma_close_s_is_user_defined():
    """The one token whose type llama.cpp overrides (OVERRIDDEN): ours follows
    the file; with special parsing llama.cpp agrees."""
    (plain, special), _ = encode(["</s>", "x</s>y"], False)
    assert plain == [212] and special[1] == 212 and len(special) == 3, (plain, special)
    ref = llama()
    assert ref.tokenize(b"</s>", add_bos=False, special=True) == [212]
    (on,), _ = encode(["x</s>y"], True)
    assert on == special == ref.tokenize(b"x</s>y", add_bos=False, special=True), (on, special)


@case
def test_gemma_decode_roundtrip():
    """decode(encode(s)) == s, except that a literal U+2581 in the text comes
    back as a space (SentencePiece cannot tell them apart; nor can llama.cpp)."""
    texts = STRINGS + random_texts()
    n = 0
    for special in (False, True):
        ids, rc = encode(texts, special)
        assert rc == 0
        back = decode(ids)
        bad = [(t, b) for t, b in zip(texts, back) if b != t.replace("\u2581", " ").encode("utf-8")]
        assert not bad, f"{len(bad)} strings do not round-trip (special={special}); first: {bad[0][0][:80]!r} -> " \
                        f"{bad[0][1][:80]!r}"
        n += len(texts)
    assert n >= 400, n


@case
def test_gemma_decode_matches_llama_cpp():
    """Each id decodes to llama.cpp's piece (special=True): every control,
    user-defined and byte token and the normal ones the strings use; and a
    whole id list to the concatenation."""
    ref = llama()
    ids = list(range(0, 600)) + list(range(262100, 262144)) + \
        sorted({i for lst in encode(STRINGS, True)[0] for i in lst})
    ours = decode([[i] for i in ids])
    bad = [(i, got, piece(ref, i)) for i, got in zip(ids, ours) if got != piece(ref, i)]
    assert not bad, f"{len(bad)} of {len(ids)} ids decode differently; first: {bad[:3]}"
    lists, _ = encode(STRINGS, True)
    for lst, got in zip(lists, decode(lists)):
        assert got == b"".join(piece(ref, i) for i in lst), lst[:10]


@case
def test_gemma_prompt_adds_bos_like_llama_cpp():
    """--prompt (tok_encode_prompt): BOS first, specials parsed, as llama.cpp's
    tokenize(add_bos=True, special=True); written out as "<bos>" it is kept
    once (llama.cpp would give two)."""
    texts = ["Hello world", "", "<start_of_turn>user\nHi<end_of_turn>\n", "  spaced", "\U00020000"]
    ours, rc = encode(texts, True, None, "--prompt")
    assert rc == 0, ours
    ref = llama()
    for t, got in zip(texts, ours):
        assert got == ref.tokenize(t.encode(), add_bos=True, special=True), (t, got)
    (once,), _ = encode(["<bos>Hello"], True, None, "--prompt")
    twice = quiet(lambda: ref.tokenize(b"<bos>Hello", add_bos=True, special=True))
    assert twice[:2] == [BOS, BOS] and once == twice[1:], (once, twice)


def render_gemma(system, user):
    """Hugging Face's Gemma 3 chat template (google/gemma-3-*-it), one user
    message after an optional system one, generation prompt added: bos_token,
    the system message and "\\n\\n" at the start of the first user turn."""
    first = system + "\n\n" if system is not None else ""
    return f"<bos><start_of_turn>user\n{first}{user}<end_of_turn>\n<start_of_turn>model\n"


CHATS = [
    (None, "What is 2+2?"),
    ("You are a helpful assistant.", "Hello!"),
    ("", ""),
    (None, "  leading and trailing spaces  "),
    ("Answer in one word.", "\n\nStarts with newlines and ends with one\n"),
    (None, "12345678 digits and 3.14159"),
    ("\u4f60\u662f\u4e00\u4e2a\u52a9\u624b\u3002", "\u65e5\u672c\u8a9e\u306e\u8cea\u554f \U0001f600 \u00e9\u00e8"),
    (None, "def f(x):\n    return x ** 2\n\n"),
    ("sys", "<b>html</b> [multimodal] \U00020000 \ue000"),
    (None, "x" * 300),
]


@case
def test_gemma_chat_matches_llama_cpp():
    """tok_chat on Gemma's vocabulary is the Gemma turn format, and its ids are
    llama.cpp's tokenization of the rendered text with special tokens parsed;
    llama.cpp's own "gemma" template renders the same text (after the BOS)
    where the contents need no trimming (it trims them)."""
    import ctypes
    import llama_cpp
    ours, rc = encode(CHATS, False, GEMMA, "--chat")
    assert rc == 0, ours
    ref = llama()
    for (system, user), got in zip(CHATS, ours):
        text = render_gemma(system, user)
        want = ref.tokenize(text.encode(), add_bos=False, special=True)
        assert got == want, f"chat {system!r} / {user[:40]!r}:\n  ours      {got}\n  llama.cpp {want}"
        assert got[:2] == [BOS, START_OF_TURN] and got.count(BOS) == 1, got[:4]
        assert got.count(END_OF_TURN) == 1 and got.count(START_OF_TURN) == 2, got
        if system is not None and system.strip() and (system, user) == (system.strip(), user.strip()):
            msgs = [("system", system), ("user", user)]
        elif system is None and user == user.strip():
            msgs = [("user", user)]
        else:
            continue
        arr = (llama_cpp.llama_chat_message * len(msgs))(
            *[llama_cpp.llama_chat_message(role=r.encode(), content=c.encode()) for r, c in msgs])
        buf = ctypes.create_string_buffer(8192)
        n = llama_cpp.llama_chat_apply_template(b"gemma", arr, len(msgs), True, buf, 8192)
        assert 0 < n < 8192 and "<bos>" + buf.raw[:n].decode() == text, (buf.raw[:n], text)


_prefix_copy = []


def prefix_copy():
    """A vocab-only copy of the Gemma file (every key, no tensors) with
    tokenizer.ggml.add_space_prefix = true: the Llama 2 way, a space before
    the text and after each special token."""
    if _prefix_copy:
        return _prefix_copy[0]
    import gguf
    from gguf_fast import GGUFReader
    r = GGUFReader(GEMMA)
    path = os.path.join(TMP, "tokenizer-gemma-prefix.gguf")
    w = gguf.GGUFWriter(path, r.get_field("general.architecture").contents())
    for f in r.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF."):
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = True if f.name == "tokenizer.ggml.add_space_prefix" else f.contents()
        w.add_key_value(f.name, value, vtype, sub_type=sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    _prefix_copy.append(path)
    return path


@case
def test_space_prefix_matches_llama_cpp():
    path = prefix_copy()
    texts = PROSE + WHITESPACE + SPECIAL + CODE + random_texts(60)
    n = compare(texts, special=False, model=path)
    n += compare(texts, special=True, model=path)
    assert n >= 200, n
    (a, b), _ = encode(["Hello", "<start_of_turn>Hello"], True, path)
    ref = llama(path)
    assert b == [START_OF_TURN] + a and piece(ref, a[0]).startswith(b" "), (a, b)
    ours, _ = encode(CHATS, False, path, "--chat")
    for (system, user), got in zip(CHATS, ours):
        assert got == ref.tokenize(render_gemma(system, user).encode(), add_bos=False, special=True), (system, user)


def run_cases():
    for name in _skipped:
        print(f"SKIP {name}: {GEMMA} missing (make model-gemma3, or set RD_GEMMA_MODEL)")
    main()


if __name__ == "__main__":
    run_cases()
