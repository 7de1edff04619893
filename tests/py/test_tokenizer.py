"""The tokenizer against llama.cpp (llama-cpp-python, vocab only) on the real model.

Our ids come from build/rollout-tokenize (hex text in, ids out; --decode for the
way back). Every string is compared with and without special-token parsing,
and decode(encode(s)) == s is checked for all of them.

The qwen2 and llama-bpe pre-tokenizers and the two chat formats are compared
the same way on vocab-only copies of the real model's file (no tensors), with
tokenizer.ggml.pre rewritten and a few tokens appended: multi-digit tokens (so
that digit grouping shows in the ids), tokens no merge produces (so that
llama-bpe's ignore_merges shows), and, for Llama 3, its control tokens.
"""
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, MODEL, TMP, case, main, run  # noqa: E402

TOOL = os.path.join(BUILD, "rollout-tokenize")

PROSE = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! How are you doing today?",
    "This is a test of the tokenizer, with commas; semicolons: and (parentheses).",
    " leading space",
    "  two leading spaces",
    "trailing space ",
    "UPPER CASE WORDS AND MiXeD cAsE, CamelCaseIdentifier",
    "e-mail: someone@example.com, url: https://example.org/path?q=1&r=2#frag",
    "Reinforcement learning from verifiable rewards samples many rollouts per prompt.",
]
CONTRACTIONS = [
    "I'm sure you're right, it's what we've said and they'll do it, he'd go.",
    "DON'T SHOUT, IT'S RUDE. I'M SURE YOU'RE RIGHT, WE'VE SEEN IT, THEY'LL KNOW, HE'D SAY",
    "'s 't 're 've 'm 'll 'd",
    "rock'n'roll o'clock y'all 'twas",
    "the dog's bone; the dogs' bones; Chris's book",
    "'S 'T 'Re 'vE",
]
DIGITS = [
    "12345",
    "3.14159265358979323846",
    "In 2024, 1,234,567 people paid $89.99 each.",
    "phone: +1 (555) 123-4567",
    "0000000000000000000000000000000012",
    "a1b2c3 x99 v2.0.1 1st 2nd 3rd",
    "\u0661\u0662\u0663 \u0664\u0665\u0666 Arabic-Indic digits, \u00bd \u00b2 \u216b \u2460",
    "9" * 50 + "1234567890" * 10,
    "\U0001d7d9\U0001d7da\U0001d7db math digits",
    "a 1, x  2, \u0663 \u0664, 1\n2 3\t4  ",
]
WHITESPACE = [
    "a  b   c    d",
    "tab\tseparated\tvalues\t",
    "line one\nline two\n\nline four",
    "\n\n\n",
    "   ",
    " ",
    "\t\t  \n \r\n mixed",
    "word\n",
    "ends with newline and spaces \n  ",
    "\u00a0non-breaking\u00a0space and\u2003em space and\u3000ideographic",
    "next\u0085line and\u2028line separator",
    "\r\n\r\n windows line endings\r\n",
    " \n",
    "\n ",
    "a \tb\t c",
    "x" + " " * 40 + "y",
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
    "\u0e44\u0e17\u0e22 \u0e20\u0e32\u0e29\u0e32",
    "\U0001d518\U0001d52b\U0001d526\U0001d520\U0001d52c\U0001d521\U0001d522 math letters",
    "a\u200bb zero width space, soft\u00adhyphen",
    "\u00ff\u00fe\u0100\u0101 \u0120 \u0121 latin-1 edges",
]
EMOJI = [
    "I love \U0001f355 and \U0001f389!",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 family ZWJ sequence",
    "\U0001f44d\U0001f3fd skin tone, \U0001f3f3\ufe0f\u200d\U0001f308 flag, \u2764\ufe0f heart",
    "\U0001f1eb\U0001f1f7\U0001f1e9\U0001f1ea flags",
    "\U0001f600" * 20,
]
CODE = [
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}",
    '{"key": "value", "list": [1, 2, 3], "nested": {"a": null}}',
    '<div class="x">&amp; &lt;tag&gt;</div>',
    "    indented = True\n        more_indented()\n",
    "$ ls -la | grep '.txt' > out.log 2>&1",
    "!!!???...---***",
    "x=1;y=2;z=x+y",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }\n",
    "a" * 70,
]
SPECIAL = [
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text<|im_end|>more text",
    "<|im_start|><|im_end|><|im_start|>",
    "<|im_start |> not special, <|im_start|x",
    "<file_sep><repo_name>repo<filename>main.py",
    "<jupyter_code>print(1)<jupyter_output>1<empty_output>",
    "before <|endoftext|> after",
    "  <|im_end|>  ",
]
EDGE = [
    "",
    "\x00 null byte and \x01\x02 control chars",
    "\u4e00" * 1500,
]


def long_text():
    """About 5 KB of everything above, shuffled reproducibly."""
    rng = random.Random(1234)
    pool = PROSE + CONTRACTIONS + DIGITS[:6] + WHITESPACE + UNICODE + EMOJI + CODE + SPECIAL
    parts, size = [], 0
    while size < 5000:
        s = rng.choice(pool)
        parts.append(s)
        size += len(s.encode()) + 1
    return " ".join(parts)


def random_texts(n=150):
    """Random mixes of the characters where the split rules meet."""
    rng = random.Random(42)
    alphabet = (list("abcXYZ  \t\n'!?.,-_0123456789") + ["'s", "'ll", "  ", "\r\n", "\u00e9", "\u4e2d",
                "\U0001f600", "\u0663", "\u00a0", "\u200d", "\u0301", "<|im_end|>", "\u00bd"])
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(n)]


STRINGS = PROSE + CONTRACTIONS + DIGITS + WHITESPACE + UNICODE + EMOJI + CODE + SPECIAL + EDGE + [long_text()]

# Bytes the vocabulary has no token for (0x04 here) are dropped by llama.cpp
# and by us alike, so such text is compared but cannot round-trip.
DROPPED = ["a\x04b", "\x06\x13\x14\x16\x1d"]


def hexline(t):
    return (t.encode("utf-8", "surrogatepass") if isinstance(t, str) else t).hex()


def encode(texts, special, model=None, mode=None):
    """Our ids for each text (or "error: ..."), and the tool's exit status.
    mode: None (encode, --special if special), "--prompt" or "--chat" (each
    text then a (system or None, user) pair)."""
    args = [TOOL, "--model", model or MODEL] + ([mode] if mode else ["--special"] if special else [])
    if mode == "--chat":
        inp = "".join((hexline(s) + ":" if s is not None else "") + hexline(u) + "\n" for s, u in texts)
    else:
        inp = "".join(hexline(t) + "\n" for t in texts)
    p = run(args, input=inp, check=False)
    lines = p.stdout.split("\n")[:-1]
    assert len(lines) == len(texts), f"{len(texts)} inputs gave {len(lines)} lines; stderr: {p.stderr[-500:]}"
    return [line if line.startswith("error:") else [int(x) for x in line.split(",")] if line else []
            for line in lines], p.returncode


def decode(id_lists):
    p = run([TOOL, "--model", MODEL, "--decode"], input="".join(",".join(map(str, ids)) + "\n" for ids in id_lists))
    lines = p.stdout.split("\n")[:-1]
    assert len(lines) == len(id_lists)
    return [bytes.fromhex(line) for line in lines]


def quiet(fn):
    """fn() with fd 2 sent to /dev/null: llama.cpp warns there even with
    verbose=False; keep it out of the PASS/FAIL lines."""
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
    model = model or MODEL
    if model not in _llama:
        try:
            import llama_cpp
        except ImportError as e:
            raise AssertionError("the oracle llama_cpp (llama-cpp-python) is not importable; run `make setup`") from e
        # llama.cpp warns about the context size on fd 2 even with verbose=False.
        _llama[model] = quiet(lambda: llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False))
    return _llama[model]


def show(ids, at):
    """The ids around index at (long lists are cut)."""
    lo = max(0, at - 4)
    return ("..." if lo else "") + str(ids[lo:at + 6])[1:-1] + ("..." if at + 6 < len(ids) else "")


def compare(texts, special, model=None):
    ours, rc = encode(texts, special, model)
    ref = llama(model)
    bad = []
    for text, got in zip(texts, ours):
        want = ref.tokenize(text.encode("utf-8"), add_bos=False, special=special)
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
                             f"{os.path.basename(model or MODEL)}): {head}")
    assert rc == 0, f"rollout-tokenize exited {rc}"
    return len(texts)


@case
def test_matches_llama_cpp_plain():
    assert len(STRINGS) >= 60, len(STRINGS)
    compare(STRINGS + DROPPED, special=False)


@case
def test_matches_llama_cpp_special():
    compare(STRINGS + DROPPED, special=True)


@case
def test_matches_llama_cpp_random_mixes():
    texts = random_texts()
    compare(texts, special=False)
    compare(texts, special=True)


@case
def test_special_tokens_parsed_only_with_flag():
    plain = encode(["<|im_start|>"], False)[0][0]
    special = encode(["<|im_start|>"], True)[0][0]
    assert special == [1], special
    assert len(plain) > 1 and 1 not in plain, plain


@case
def test_decode_roundtrip():
    texts = STRINGS + random_texts()
    for special in (False, True):
        ids, rc = encode(texts, special)
        assert rc == 0
        back = decode(ids)
        bad = [(t, b) for t, b in zip(texts, back) if b != t.encode("utf-8")]
        assert not bad, f"{len(bad)} strings do not round-trip (special={special}); first: {bad[0][0][:80]!r} -> " \
                        f"{bad[0][1][:80]!r}"


@case
def test_decode_matches_llama_cpp():
    ids, _ = encode(STRINGS, special=False)
    ref = llama()
    ours = decode(ids)
    for text, got, i in zip(STRINGS, ours, ids):
        want = ref.detokenize(i)
        assert got == want, f"decode of {text[:60]!r}: ours {got[:80]!r}, llama.cpp {want[:80]!r}"


@case
def test_invalid_utf8_is_an_error_with_offset():
    cases = [b"ab\xffcd", b"\xc3", b"ok \xed\xa0\x80 surrogate", b"\xc0\xafoverlong", b"\xf4\x90\x80\x80 too big"]
    out, rc = encode(cases + ["still fine"], False)
    assert rc == 1, f"exit status {rc}, expected 1 when a line fails"
    offsets = [2, 0, 3, 0, 0]
    for raw, line, off in zip(cases, out, offsets):
        assert isinstance(line, str) and "UTF-8" in line and f"offset {off}" in line, (raw, line)
    assert out[-1] == [28919, 4979], out[-1]  # the next line is still served


@case
def test_cli_rejects_bad_usage():
    p = run([TOOL], check=False)
    assert p.returncode == 2 and "--model" in p.stderr, p.stderr
    p = run([TOOL, "--model", MODEL, "--bogus"], check=False)
    assert p.returncode == 2 and "--bogus" in p.stderr, p.stderr
    p = run([TOOL, "--model", MODEL, "--special", "--decode"], check=False)
    assert p.returncode == 2 and "--special" in p.stderr, p.stderr
    p = run([TOOL, "--model", "/nonexistent.gguf"], input="", check=False)
    assert p.returncode == 1 and "/nonexistent.gguf" in p.stderr, p.stderr
    p = run([TOOL, "--model", MODEL], input="abc\nzz\n", check=False)
    assert p.returncode == 1 and p.stdout.count("error:") == 2, p.stdout
    p = run([TOOL, "--model", MODEL, "--decode"], input="1,2,49152\n1,,2\n-1\n1,2,\n", check=False)
    lines = p.stdout.splitlines()
    assert p.returncode == 1 and len(lines) == 4 and all(x.startswith("error:") for x in lines), p.stdout
    assert "49152" in lines[0], lines[0]


# ---------------------------------------------------------------------------
# qwen2 and llama-bpe, Llama 3 and ChatML chat prompts.

def byte_level(text):
    """GPT-2's byte-level form of text (the way the vocabulary writes tokens):
    printable Latin-1 bytes stand for themselves, the other 68 bytes take
    U+0100.. in byte order."""
    keep = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return "".join(table[b] for b in text.encode("utf-8"))


# Appended to the vocabulary: multi-digit tokens with merges (SmolLM2's vocab
# has single digits only, so grouping would not show), and tokens that no merge
# produces: with ignore_merges (llama-bpe) a piece equal to one is that token,
# without it (qwen2) the merges split it.
DIGIT_TOKENS = [("12", "1 2"), ("123", "12 3"), ("45", "4 5"), ("456", "45 6"), ("78", "7 8")]
UNMERGED = ["999", " supercalifragilistic", "supercalifragilistic", "\u65e5\u672c\u8a9e", "!?!"]
LLAMA3_CONTROL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

_copies = {}


def vocab_copy(name, pre, control=(), eos=None, add_bos=None, drop=()):
    """A vocab-only copy of the real model's file (every key, no tensors) with
    tokenizer.ggml.pre = pre, DIGIT_TOKENS and UNMERGED appended as normal
    tokens and `control` as control tokens; bos = the first control token if
    any; eos = the named token; add_bos_token as given; keys in drop left
    out. Returns (path, token text -> id of the appended tokens)."""
    if name in _copies:
        return _copies[name]
    import gguf
    from gguf_fast import GGUFReader
    r = GGUFReader(MODEL)
    tokens = list(r.get_field("tokenizer.ggml.tokens").contents())
    types = list(r.get_field("tokenizer.ggml.token_type").contents())
    merges = list(r.get_field("tokenizer.ggml.merges").contents())
    have = set(tokens)
    ids = {}
    for text, ttype in [(t, 1) for t, _ in DIGIT_TOKENS] + [(t, 1) for t in UNMERGED] + [(t, 3) for t in control]:
        form = byte_level(text) if ttype == 1 else text
        assert form not in have, f"{text!r} is already in the vocabulary; pick another test token"
        ids[text] = len(tokens)
        tokens.append(form)
        types.append(ttype)
    merges += [m for _, m in DIGIT_TOKENS]
    new = {"tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
           "tokenizer.ggml.merges": merges}
    if control:
        new["tokenizer.ggml.bos_token_id"] = ids[control[0]]
    if eos is not None:
        new["tokenizer.ggml.eos_token_id"] = ids[eos]
    if add_bos is not None:
        new["tokenizer.ggml.add_bos_token"] = add_bos
    path = os.path.join(TMP, f"tokenizer-{name}.gguf")
    w = gguf.GGUFWriter(path, r.get_field("general.architecture").contents())
    for f in r.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF.") or f.name in drop:
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, new.get(f.name, f.contents()), vtype, sub_type=sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    _copies[name] = (path, ids)
    return _copies[name]


def qwen2_copy():
    """Qwen-like: qwen2 pre-tokenizer, ChatML (SmolLM2's markers), eos <|im_end|>."""
    return vocab_copy("qwen2", "qwen2")


def llama3_copy(eos="<|eot_id|>"):
    """Llama 3-like: llama-bpe, its control tokens, BOS <|begin_of_text|> added
    to prompts, eos as given; SmolLM2's ChatML chat template left out (with
    both marker sets and a ChatML template the vocabulary would count as ChatML)."""
    return vocab_copy("llama3-" + eos.strip("<|>"), "llama-bpe", LLAMA3_CONTROL, eos, True,
                      drop=("tokenizer.chat_template",))


# Strings where qwen2 and llama-bpe split differently from the GPT-2 pattern or
# from each other: digit runs, contractions in either case, whitespace and
# newline runs, punctuation before newlines, a non-letter before a word, the
# appended tokens alone and inside text, and Llama 3's control tokens.
PRE_STRINGS = [
    "12345678", "1234567", "123 4567 89", "0" * 10, "x12y345z", "3.14159 2,718,281", "v1.2.34", "999", "9999",
    " 999", "a999b", "\u0661\u0662\u0663\u0664\u0665 Arabic-Indic", "\u00bd\u00bc \u2460\u2461\u2462",
    "IT'S YOU'RE WE'VE I'M THEY'LL HE'D DON'T", "'S 'T 'RE 'VE 'M 'LL 'D", "'s 'll 'Ll 'lL", "x'\u017f long s",
    "a\n\nb", "a \n\n b", "\n\n\n\tfoo", "x\r\n\r\ny", "  \n  \n  ", "foo  \n", "end\n\n", "}\n\n\n}", ";\n",
    "!!!\n\n", "?\r\n", "  hello", "\thello", "\u00a0hello", "(hello)", "$hello", "\u2014word and \u2013dash",
    "_private __dunder__", "#include", "@user", "\U0001f600hello", "\u3000\u4e2d\u6587",
    "Hello\nWorld", "1\n2\n\n3", " supercalifragilistic", "supercalifragilistic!", "a supercalifragilistic b",
    "\u65e5\u672c\u8a9e", "\u65e5\u672c\u8a9e\u306e", " \u65e5\u672c\u8a9e", "!?!", " !?!", "!?!?", "!?!\n",
    "if (x) {\n\treturn 1;\n}\n", "def f():\n    pass\n\n\n", "a  =  b", "x" + " " * 17 + "y", " " * 33,
    "<|begin_of_text|>Hi<|eot_id|>", "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<|eot_id|><|eot_id|> <|end_of_text|>", "<|begin_of_text |> not special",
]


def family_strings():
    texts = STRINGS + DROPPED + PRE_STRINGS + random_texts()
    assert len(texts) >= 100, len(texts)
    return texts


@case
def test_qwen2_matches_llama_cpp():
    path, _ = qwen2_copy()
    n = compare(family_strings(), special=False, model=path)
    n += compare(family_strings(), special=True, model=path)
    assert n >= 200, n


@case
def test_llama_bpe_matches_llama_cpp():
    path, _ = llama3_copy()
    n = compare(family_strings(), special=False, model=path)
    n += compare(family_strings(), special=True, model=path)
    assert n >= 200, n


@case
def test_digit_groups_and_ignore_merges():
    """The differences the pre-tokenizers are about, in our ids: qwen2 cuts
    every digit, llama-bpe groups up to three; llama-bpe takes a piece that is
    a token whole where qwen2's merges split it."""
    qpath, qid = qwen2_copy()
    lpath, lid = llama3_copy()
    texts = ["12345678", "999", " supercalifragilistic", "\u65e5\u672c\u8a9e", "!?!"]
    (q8, q9, qs, qj, qp), _ = encode(texts, False, qpath)
    (l8, l9, ls, lj, lp), _ = encode(texts, False, lpath)
    assert len(q8) == 8 and l8 == [lid["123"], lid["456"], lid["78"]], (q8, l8)
    assert l9 == [lid["999"]] and len(q9) == 3, (l9, q9)
    assert ls == [lid[" supercalifragilistic"]] and len(qs) > 1 and lid[" supercalifragilistic"] not in qs, (ls, qs)
    assert lj == [lid["\u65e5\u672c\u8a9e"]] and len(qj) > 1, (lj, qj)
    assert lp == [lid["!?!"]] and len(qp) > 1, (lp, qp)
    lref, qref = llama(lpath), llama(qpath)
    assert [lref.tokenize(t.encode(), add_bos=False, special=False) for t in texts] == [l8, l9, ls, lj, lp]
    assert [qref.tokenize(t.encode(), add_bos=False, special=False) for t in texts] == [q8, q9, qs, qj, qp]


@case
def test_cli_chat_prompt_info_usage():
    p = run([TOOL, "--model", MODEL, "--chat", "--decode"], check=False)
    assert p.returncode == 2 and "--chat" in p.stderr and "--decode" in p.stderr, p.stderr
    p = run([TOOL, "--model", MODEL, "--chat"], input="zz\n" + "61:62:63\n" + "6100:62\n" + "6869\n", check=False)
    lines = p.stdout.splitlines()
    assert p.returncode == 1 and len(lines) == 4, p.stdout
    assert lines[0].startswith("error:") and lines[1].startswith("error:"), lines
    assert lines[2].startswith("error:") and "NUL" in lines[2], lines[2]
    assert lines[3] == ",".join(map(str, encode([(None, "hi")], False, MODEL, "--chat")[0][0])), lines[3]
    p = run([TOOL, "--model", MODEL, "--info"])
    assert "chat chatml" in p.stdout.splitlines(), p.stdout


def render_llama3(bos, system, user):
    s = bos
    if system is not None:
        s += f"<|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>"
    return s + f"<|start_header_id|>user<|end_header_id|>\n\n{user}<|eot_id|>" \
               "<|start_header_id|>assistant<|end_header_id|>\n\n"


def render_chatml(system, user):
    s = f"<|im_start|>system\n{system}<|im_end|>\n" if system is not None else ""
    return s + f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


CHATS = [
    (None, "What is 2+2?"),
    ("You are a helpful assistant.", "Hello!"),
    ("", ""),
    (None, "  leading and trailing spaces  "),
    ("Answer in one word.", "\n\nStarts with newlines and ends with one\n"),
    (None, "12345678 digits and 3.14159"),
    ("\u4f60\u662f\u4e00\u4e2a\u52a9\u624b\u3002", "\u65e5\u672c\u8a9e\u306e\u8cea\u554f \U0001f600 \u00e9\u00e8"),
    (None, "I'm sure YOU'LL see it's fine"),
    (None, "def f(x):\n    return x ** 2\n\n"),
    ("sys", " supercalifragilistic !?! 999"),
    (None, "x" * 300),
]


@case
def test_llama3_chat_matches_llama_cpp():
    """tok_chat on a vocabulary with Llama 3's markers is the header format,
    and its ids are llama.cpp's tokenization of the rendered text with special
    tokens parsed, BOS included once."""
    path, ids = llama3_copy()
    info = dict(line.split(" ", 1) for line in run([TOOL, "--model", path, "--info"]).stdout.splitlines())
    assert info["chat"] == "llama3", info
    ours, rc = encode(CHATS, False, path, "--chat")
    assert rc == 0, ours
    ref = llama(path)
    bos = "<|begin_of_text|>"
    for (system, user), got in zip(CHATS, ours):
        want = ref.tokenize(render_llama3(bos, system, user).encode(), add_bos=False, special=True)
        assert got == want, f"chat {system!r} / {user[:40]!r}:\n  ours      {got}\n  llama.cpp {want}"
        assert got.count(ids[bos]) == 1 and got[0] == ids[bos], got[:4]
        assert got.count(ids["<|eot_id|>"]) == (2 if system is not None else 1), got
        assert got[-1] == ref.tokenize(b"\n\n", add_bos=False, special=False)[-1]


@case
def test_chatml_chat_matches_llama_cpp():
    """The same on the qwen2 copy: ChatML, and the ids are llama.cpp's."""
    path, _ = qwen2_copy()
    ours, rc = encode(CHATS, False, path, "--chat")
    assert rc == 0, ours
    ref = llama(path)
    for (system, user), got in zip(CHATS, ours):
        want = ref.tokenize(render_chatml(system, user).encode(), add_bos=False, special=True)
        assert got == want, f"chat {system!r} / {user[:40]!r}:\n  ours      {got}\n  llama.cpp {want}"
        assert got[0] == 1, got[:3]


@case
def test_prompt_bos_matches_llama_cpp():
    """A plain-text prompt on a vocabulary that adds a BOS (Llama 3) starts
    with it, as llama.cpp's tokenize with add_bos; written out in the text it
    is kept once (llama.cpp would give two)."""
    path, ids = llama3_copy()
    texts = ["Hello world", "12345678", "", "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"]
    ours, rc = encode(texts, True, path, "--prompt")
    assert rc == 0, ours
    ref = llama(path)
    for t, got in zip(texts, ours):
        assert got == ref.tokenize(t.encode(), add_bos=True, special=True), (t, got)
    (once,), _ = encode(["<|begin_of_text|>Hello"], True, path, "--prompt")
    twice = quiet(lambda: ref.tokenize(b"<|begin_of_text|>Hello", add_bos=True, special=True))
    assert twice[:2] == [ids["<|begin_of_text|>"]] * 2 and once == twice[1:], (once, twice)
    # SmolLM2 adds none: --prompt is --special.
    plain, _ = encode(texts[:2], True)
    prompt, _ = encode(texts[:2], True, None, "--prompt")
    assert plain == prompt, (plain, prompt)


@case
def test_stop_tokens_per_family():
    """eos is the file's; eot the chat format's end of turn. A Llama 3 file
    whose eos is <|end_of_text|> still has <|eot_id|> as its end of turn (the
    engine stops at both); SmolLM2 and the Qwen-like copy end turns at
    <|im_end|> = eos."""
    def info(model):
        p = run([TOOL, "--model", model, "--info"])
        return {k: v for k, v in (line.split(" ", 1) for line in p.stdout.splitlines())}
    smol = info(MODEL)
    assert smol == {**smol, "chat": "chatml", "eos": "2", "eot": "2", "add_bos": "0", "bos": "1"}, smol
    qpath, _ = qwen2_copy()
    q = info(qpath)
    assert q["chat"] == "chatml" and q["eot"] == q["eos"] == "2", q
    for eos in ("<|eot_id|>", "<|end_of_text|>"):
        path, ids = llama3_copy(eos)
        i = info(path)
        want = {"chat": "llama3", "bos": str(ids["<|begin_of_text|>"]), "eos": str(ids[eos]),
                "eot": str(ids["<|eot_id|>"]), "add_bos": "1"}
        assert {k: i[k] for k in want} == want, (eos, i, want)
        # llama.cpp agrees on eos, and ends generation at <|eot_id|> and <|end_of_text|> either way.
        import llama_cpp
        ref = llama(path)
        assert ref.token_eos() == ids[eos], (ref.token_eos(), ids[eos])
        for t in ("<|eot_id|>", "<|end_of_text|>"):
            assert llama_cpp.llama_vocab_is_eog(ref._model.vocab, ids[t]), (eos, t)


if __name__ == "__main__":
    main()
