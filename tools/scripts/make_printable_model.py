#!/usr/bin/env python3
"""Copies a GGUF with a GPT-2 byte-level vocab (tandem's synthetic models) and respells its
standalone byte tokens 0x80..0xFF as two printable ASCII characters, in place (same length:
no offset moves). The weights and every other token stay as they are.

Why: a random-weight model emits those byte tokens alone, which are invalid UTF-8, and
llama-server's output parser then fails (HTTP 500). With this copy both servers run the same
weights and shapes in a benchmark and every answer is text. (tandem serves the copy too.)

  PYTHONPATH=../shared/peers/llama.cpp/gguf-py /usr/bin/python3 tools/scripts/make_printable_model.py IN.gguf OUT.gguf
"""
import os
import shutil
import sys

import gguf  # llama.cpp's gguf-py (../shared/peers/llama.cpp/gguf-py)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_peers import gpt2_byte_chars  # noqa: E402


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    shutil.copyfile(src, dst)
    r = gguf.GGUFReader(dst, "r+")
    f = r.fields["tokenizer.ggml.tokens"]
    texts = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
    taken = set(texts)
    spelling = gpt2_byte_chars()
    ascii_pairs = (a + b for a in "~^`|" for b in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
    changed = 0
    for byte in range(0x80, 0x100):
        s = spelling[byte]
        if s not in taken:
            continue
        i = texts.index(s)
        part = f.parts[f.data[i]]
        new = next(p for p in ascii_pairs if p not in taken)
        enc = new.encode("ascii")
        if len(enc) != len(part):
            sys.exit(f"token {i} has {len(part)} bytes, not 2: not a GPT-2 byte-level vocab?")
        part[:] = list(enc)
        taken.add(new)
        changed += 1
    r.data.flush()
    print(f"{dst}: {changed} byte tokens respelled as printable ASCII")


if __name__ == "__main__":
    main()
