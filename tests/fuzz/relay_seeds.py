#!/usr/bin/env python3
"""Seed inputs for build/fuzz/fuzz_relay: streams of the frames a relay reads
back from the next daemon's lane (and the lane's own first frames), made of
the golden vectors in proto/testdata: each seed is frames A, B, A back to
back plus one byte (fuzz_relay takes its piece size from the last byte).
    python3 tests/fuzz/relay_seeds.py OUT_DIR"""
import itertools
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FRAMES = ["update_chunk_ok.bin", "error.bin", "auth_challenge.bin", "lane_auth.bin", "error_unauthorized.bin",
          "update_prepare_ok.bin", "update_forward_ok.bin"]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    frames = {}
    for name in FRAMES:
        with open(os.path.join(ROOT, "proto", "testdata", name), "rb") as f:
            frames[name] = f.read()
    for k, (a, b) in enumerate(itertools.permutations(FRAMES, 2)):
        with open(os.path.join(out, f"pair{k}.bin"), "wb") as f:
            f.write(frames[a] + frames[b] + frames[a] + bytes([k % 97]))
    print(f"{k + 1} seeds in {out}")


if __name__ == "__main__":
    main()
