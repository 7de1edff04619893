"""The one message table (proto/messages.def) and what is generated from it.

tools/python/rolloutd/proto_table.py must be what tools/gen_proto_py.py
writes from the table now (else: run the generator); the Python types agree
with the C ones (build/rollout-protodump names every defined type, refuses
the rest with the same "expected one of" text); the UNKNOWN_TYPE text and the
"undefined type next to the update types" come from the table.
"""
import json
import os
import struct
import subprocess
import sys

from harness import BUILD, ROOT, TMP, case, main

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import proto as P  # noqa: E402
from rolloutd import proto_table  # noqa: E402


@case
def generated_table_is_up_to_date():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_proto_py.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@case
def python_types_follow_the_table():
    assert [(t.name, int(t)) for t in P.T] == [(n, c) for n, c, _ in proto_table.TYPES]
    assert {t for t in P.T if P.is_request(t)} == {P.T[n] for n, _, s in proto_table.TYPES if s}
    assert set(P.CLASSES) == set(P.T)
    for t, cls in P.CLASSES.items():
        assert cls.TYPE == t, t.name
        try:
            frame = P.encode(cls())
        except ValueError:      # a default the decoder would refuse (WEIGHTS_SYNC's empty url)
            continue
        assert P.decode(frame) == cls(), t.name
    assert P.undefined_type_after(P.T.WEIGHTS_SYNC) not in P.T._value2member_map_


@case
def c_names_and_expected_text_follow_the_table():
    tool = os.path.join(BUILD, "rollout-protodump")
    paths = []
    for code in range(0x100):
        p = os.path.join(TMP, f"type_{code:02x}.bin")
        with open(p, "wb") as f:
            f.write(struct.pack("<4sHHII", P.MAGIC, P.VERSION, code, 0, 0))
        paths.append(p)
    out = subprocess.run([tool] + paths, capture_output=True, text=True).stdout.splitlines()
    assert len(out) == 0x100, len(out)
    want = f"expected one of {P.types_expected()}"
    for code, line in enumerate(out):
        d = json.loads(line)
        if code in P.T._value2member_map_:
            # defined: decoded (empty body fits STATUS only) or refused as MALFORMED, never UNKNOWN_TYPE
            assert d.get("type") == P.T(code).name or d.get("error") == P.E.MALFORMED, (code, d)
        else:
            assert d["error"] == P.E.UNKNOWN_TYPE and want in d["message"], (code, d)
            try:
                P.decode(open(paths[code], "rb").read())
                raise AssertionError(f"type {code:#x} decoded")
            except P.ProtoError as e:
                assert e.code == P.E.UNKNOWN_TYPE and want in e.message, (code, e)


if __name__ == "__main__":
    main()
