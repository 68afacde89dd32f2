#!/usr/bin/python3
# Development tool (needs ../shared/peers and python3-numpy; the tests only read its output):
# llama-tokenize's ids for a corpus of tricky strings under each tokenizer.ggml.pre tandem
# implements, on a synthetic model with 253 merges (tandem model synth --preset kquant --dtype f32 --seed 1)
# with its pre key rewritten. Writes tests/data/pretok/reference.json.
#   tools/scripts/make_pretok_fixtures.py BUILD_DIR LLAMA_BIN_DIR PEERS_GGUF_PY
import json, os, subprocess, sys, tempfile
import numpy as np
build, llama_bin, gguf_py = sys.argv[1:4]
sys.path.insert(0, gguf_py)
import gguf

CORPUS = [
    "Hello world",
    "  leading and   multiple   spaces  ",
    "tabs\tand\nnewlines\n\n\r\n end",
    "digits 1 12 123 1234 12345 1234567890",
    "I'm you're WE'LL they'D don't it's",
    "code: for (int i = 0; i < n; ++i) { x[i] += y[i]; }",
    "CJK 你好世界，日本語のテキスト",
    "emoji 🙂🚀 and ümlauts café naïve",
    "punctuation!!! ??? ... --- (( )) \"quotes\"",
    "trailing spaces   \n   \n",
    "mixed123abc456 x2 3x",
    "\n\n\n",
    "a",
    "The keeper climbed its 112 steps.\nShe had done it for 23 years.\n\nThen (the lamp) went out!\n",
    "She found the old oil lantern; she filled it with her hands, and the light came back.\r\n",
    "WHAT would YOU have DONE? It's better, isn't it? They'll wait, we'd go.",
    "  \t  indented\n\tcode(x)\n    return 2025;\n",
]
PRES = ["gpt-2", "llama-bpe", "qwen2", "smollm"]

work = tempfile.mkdtemp()
base = os.path.join(work, "tiny.gguf")
subprocess.run([os.path.join(build, "tools/tandem"), "model", "synth", "--preset", "kquant", "--dtype", "f32",
                "--seed", "1", "--out", base], check=True, capture_output=True)
src = gguf.GGUFReader(base)

def rewrite(pre, path):
    w = gguf.GGUFWriter(path, "llama")
    for f in src.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        vt = f.types[0]
        if f.name == "tokenizer.ggml.pre":
            w.add_string(f.name, pre)
        elif vt == gguf.GGUFValueType.ARRAY:
            if f.types[1] == gguf.GGUFValueType.STRING:
                w.add_array(f.name, [bytes(f.parts[i]).decode("utf-8") for i in f.data])
            else:
                w.add_array(f.name, [f.parts[i].tolist()[0] for i in f.data])
        elif vt == gguf.GGUFValueType.STRING:
            w.add_string(f.name, bytes(f.parts[f.data[0]]).decode("utf-8"))
        else:
            w.add_key_value(f.name, f.parts[f.data[0]].tolist()[0], vt)
    for t in src.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_shape=list(reversed([int(x) for x in t.shape])),
                     raw_dtype=t.tensor_type)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()

out = []
for pre in PRES:
    path = os.path.join(work, "tiny-%s.gguf" % pre)
    rewrite(pre, path)
    for text in CORPUS:
        tf = os.path.join(work, "text.txt")
        with open(tf, "w", encoding="utf-8") as fh:
            fh.write(text)
        r = subprocess.run([os.path.join(llama_bin, "llama-tokenize"), "-m", path, "-f", tf, "--ids", "--no-bos",
                            "--no-escape", "--no-parse-special", "--log-disable"], check=True, capture_output=True, text=True)
        ids = json.loads(r.stdout.strip().splitlines()[-1])
        out.append({"pre": pre, "text": text, "ids": ids})
# Control tokens written in text: parsed (llama-tokenize's default) and not (--no-parse-special),
# on an SPM vocab (stories260K: add_space_prefix) and a BPE one (the llama-bpe variant above).
SPECIAL = ["<s>Once upon a time</s> there", "Hello <s> world", "</s></s>x", "<unk> and <s>", "a<s>b</s>c", "  <s>  "]
special = []
for name, path in [("stories260K", "tests/data/stories260K.gguf"), ("kquant-llama-bpe", os.path.join(work, "tiny-llama-bpe.gguf"))]:
    for text in SPECIAL:
        for parse in (True, False):
            tf = os.path.join(work, "text.txt")
            with open(tf, "w", encoding="utf-8") as fh:
                fh.write(text)
            args = [os.path.join(llama_bin, "llama-tokenize"), "-m", path, "-f", tf, "--ids", "--no-bos", "--no-escape",
                    "--log-disable"] + ([] if parse else ["--no-parse-special"])
            r = subprocess.run(args, check=True, capture_output=True, text=True)
            special.append({"model": name, "parse_special": parse, "text": text,
                            "ids": json.loads(r.stdout.strip().splitlines()[-1])})
with open("tests/data/pretok/special.json", "w", encoding="utf-8") as fh:
    fh.write("[\n" + ",\n".join(json.dumps(c, ensure_ascii=False) for c in special) + "\n]\n")
with open("tests/data/pretok/reference.json", "w", encoding="utf-8") as fh:  # one case per line
    fh.write("[\n" + ",\n".join(json.dumps(c, ensure_ascii=False) for c in out) + "\n]\n")
print("wrote %d cases" % len(out))
