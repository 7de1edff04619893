"""The tokenizer against llama.cpp (llama-cpp-python, vocab only) on the real model.

Our ids come from build/rollout-tokenize (hex text in, ids out; --decode for the
way back). Every string is compared with and without special-token parsing,
and decode(encode(s)) == s is checked for all of them.
"""
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, MODEL, case, main, run  # noqa: E402

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


def encode(texts, special):
    args = [TOOL, "--model", MODEL] + (["--special"] if special else [])
    inp = "".join(t.encode("utf-8", "surrogatepass").hex() + "\n" if isinstance(t, str) else t.hex() + "\n"
                  for t in texts)
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


_llama = None


def llama():
    global _llama
    if _llama is None:
        try:
            import llama_cpp
        except ImportError as e:
            raise AssertionError("the oracle llama_cpp (llama-cpp-python) is not importable; run `make setup`") from e
        # llama.cpp warns about the context size on fd 2 even with verbose=False;
        # keep it out of the PASS/FAIL lines.
        saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        try:
            _llama = llama_cpp.Llama(model_path=MODEL, vocab_only=True, verbose=False)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(null)
    return _llama


def show(ids, at):
    """The ids around index at (long lists are cut)."""
    lo = max(0, at - 4)
    return ("..." if lo else "") + str(ids[lo:at + 6])[1:-1] + ("..." if at + 6 < len(ids) else "")


def compare(texts, special):
    ours, rc = encode(texts, special)
    ref = llama()
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
        raise AssertionError(f"{len(bad)} of {len(texts)} strings differ from llama.cpp (special={special}): {head}")
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


if __name__ == "__main__":
    main()
