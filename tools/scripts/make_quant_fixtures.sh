#!/usr/bin/env bash
# Development tool (needs ../shared/peers; the tests only read what it writes): makes the
# k-quant conformance fixtures under tests/data/kquant from a synthetic f32 model.
#   1. tandem model synth --preset kquant (1 layer, rows multiples of 256), f32;
#   2. llama-quantize to Q4_K_M, Q5_K_M, Q6_K and Q4_0 (llama.cpp's own quantizer);
#   3. gguf-py (llama.cpp's numpy reader) dequantizes every tensor: FNV-1a 64 of its f32 bytes;
#   4. llama-tokenize's prompt ids and llama-completion's greedy output bytes (hex) per file.
#   tools/scripts/make_quant_fixtures.sh BUILD_DIR [PEERS_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:?build dir}
peers=${2:-../shared/peers/llama.cpp}
out=tests/data/kquant
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The peers' library links are flattened into text files: stage real links beside copies.
mkdir -p "$work/bin"
for f in "$peers"/bin/*; do
  b=$(basename "$f")
  if [ "$(file -b "$f")" = "ASCII text, with no line terminators" ]; then ln -sf "$(cat "$f")" "$work/bin/$b"
  else cp "$f" "$work/bin/$b"; fi
done
"$build/tools/tandem" model synth --preset kquant --dtype f32 --seed 7 --out "$work/kq-f32.gguf"
prompt="Once upon a time"
: > "$out/reference.txt"
for q in Q4_K_M Q5_K_M Q6_K Q4_0; do
  "$work/bin/llama-quantize" "$work/kq-f32.gguf" "$out/kq-$q.gguf" "$q" 1 >/dev/null 2>&1
  ids=$("$work/bin/llama-tokenize" -m "$out/kq-$q.gguf" -p "$prompt" --ids --log-disable 2>/dev/null | tail -1 | tr -d '[],')
  text=$("$work/bin/llama-completion" -m "$out/kq-$q.gguf" -no-cnv --temp 0 -n 24 -p "$prompt" -t 1 2>/dev/null | od -An -v -tx1 | tr -d ' \n')
  echo "file kq-$q.gguf" >> "$out/reference.txt"
  echo "prompt_ids $ids" >> "$out/reference.txt"
  echo "greedy_hex $text" >> "$out/reference.txt"
  PYTHONPATH="$peers/gguf-py" /usr/bin/python3 - "$out/kq-$q.gguf" >> "$out/reference.txt" <<'PY'
import sys
import numpy as np
import gguf
from gguf import quants
r = gguf.GGUFReader(sys.argv[1])
for t in r.tensors:
    v = quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
    h = 0xcbf29ce484222325
    for b in v.tobytes():
        h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
    print("tensor %s %s %d %016x" % (t.name, t.tensor_type.name, v.size, h))
PY
done
echo "wrote $out"
