#!/usr/bin/python3
# Development tool (needs ../shared/peers; the tests only read what it writes): makes the
# per-architecture conformance fixtures under tests/data/arch.
#   1. tandem model synth --preset arch --arch A --output-scale 8 (f32, f16, bf16 and q8_0): small
#      random models with each architecture's parts and "peaky" output heads (large top-2
#      margins). Not committed: synth makes the same bytes again, so the test makes them and
#      checks their FNV-1a 64 against the one recorded here;
#      Q4_0, Q4_K_M, Q5_K_M, Q6_K (between them every Q4_0, Q4_K, Q5_K and Q6_K tensor): an f32
#      synth of preset arch-kquant (rows multiples of 256) quantized by llama-quantize,
#      committed (tandem's quantizer is not llama.cpp's);
#   2. llama-server (llama.cpp, f32 KV cache, flash attention off: its CPU kernel rounds through f16) tokenizes fixed prompts and continues them greedily,
#      streaming, with n_probs: llama.cpp's token ids and top-k log-probabilities at every step.
#      Byte tokens >= 0x80 are banned by logit_bias (llama-server fails on a stream whose text is
#      not UTF-8); its reported log-probabilities are those of the raw logits, before the bias.
#   tools/scripts/make_arch_fixtures.py BUILD_DIR [PEERS_DIR]
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_peers import free_port, post, stage_bin, stream_completion, wait_healthy  # noqa: E402

root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
build = os.path.abspath(sys.argv[1])
peers = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else os.path.join(root, "..", "shared", "peers", "llama.cpp"))
out = os.path.join(root, "tests", "data", "arch")
os.makedirs(out, exist_ok=True)
work = tempfile.mkdtemp()

bindir = stage_bin(peers, work)

ARCHS = ["llama", "qwen2", "qwen3", "gemma3", "phi3"]
DTYPES = ["f32", "f16", "bf16", "q8_0", "Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K"]
PRESETS = {"Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K"}  # llama-quantize's; the others are synth's types
# The second prompt runs past Gemma 3's sliding window (8 in these files) before generating.
PROMPTS = ["Once upon a time", "The quick brown fox jumps over the lazy dog, and then"]
STEPS = 24
TOP_K = 8
BANNED = [3 + b for b in range(128, 256)]  # the byte tokens of bytes 0x80-0xff (synth vocab layout)



cases = []
for arch in ARCHS:
    for dtype in DTYPES:
        name = f"{arch}-{dtype}.gguf"
        committed = dtype in PRESETS
        path = os.path.join(out if committed else work, name)
        synth_out = os.path.join(work, "f32-" + name) if committed else path
        subprocess.run([os.path.join(build, "tools", "tandem"), "model", "synth", "--preset",
                        "arch-kquant" if committed else "arch", "--arch", arch, "--dtype", "f32" if committed else dtype,
                        "--output-scale", "8", "--seed", "11", "--out", synth_out],
                       check=True, capture_output=True)
        if committed:
            subprocess.run([os.path.join(bindir, "llama-quantize"), synth_out, path, dtype, "1"], check=True,
                           capture_output=True)
        with open(path, "rb") as f:
            h = 0xcbf29ce484222325
            for b in f.read():
                h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
        fnv = "%016x" % h
        port = free_port()
        srv = subprocess.Popen([os.path.join(bindir, "llama-server"), "-m", path, "-t", "1", "-c", "256", "-np", "1",
                                "-ctk", "f32", "-ctv", "f32", "-fa", "off", "--port", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_healthy(port)
            for prompt in PROMPTS:
                ids = json.load(post(port, "/tokenize", {"content": prompt, "add_special": True}))["tokens"]
                body = {"prompt": ids, "n_predict": STEPS, "n_probs": TOP_K, "temperature": 0, "stream": True,
                        "logit_bias": [[t, False] for t in BANNED], "cache_prompt": False}
                steps = stream_completion(port, body)
                cases.append({"file": name, "arch": arch, "dtype": dtype, "seed": 11, "output_scale": 8, "committed": committed,
                              "fnv1a64": fnv, "prompt": prompt, "prompt_ids": ids,
                              "steps": steps})
                print(f"{name}: '{prompt}' -> {len(steps)} steps")
        finally:
            srv.terminate()
            srv.wait()

with open(os.path.join(out, "reference.json"), "w") as f:
    head = {"made_by": "tools/scripts/make_arch_fixtures.py", "llama_cpp": "../shared/peers/llama.cpp (81ff7abe50b9)",
            "banned": BANNED, "top_k": TOP_K}
    # One case a line: small, and diffs show which cases changed.
    f.write(json.dumps(head)[:-1] + ', "cases": [\n' + ",\n".join(json.dumps(c) for c in cases) + "\n]}\n")
shutil.rmtree(work)
print("wrote", out)
