#!/usr/bin/python3
# Development tool (needs ../shared/peers; the tests only read what it writes): a SentencePiece
# vocabulary set up as Gemma's is (no space prefix, byte fallback, BOS added, <start_of_turn> and
# <end_of_turn> control tokens, a user-defined token), and llama.cpp's tokenization of a corpus
# with it: the pieces and scores are stories260K's (tests/data), the settings Gemma's, so the
# test needs no npm package (the real Gemma 3 vocabulary is tests/test_real_vocab's).
#   tools/scripts/make_spm_fixtures.py [PEERS_DIR]  -> tests/data/spm/{gemma-style-vocab.gguf,reference.json}
import json
import os
import shutil
import subprocess
import sys
import tempfile

root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
peers = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "..", "shared", "peers", "llama.cpp"))
sys.path.insert(0, os.path.join(peers, "gguf-py"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf  # noqa: E402
from llama_peers import stage_bin  # noqa: E402

out = os.path.join(root, "tests", "data", "spm")
os.makedirs(out, exist_ok=True)
work = tempfile.mkdtemp()
bindir = stage_bin(peers, work)

src = gguf.GGUFReader(os.path.join(root, "tests", "data", "stories260K.gguf"))
field = lambda k: src.fields[k]
tokens = [bytes(field("tokenizer.ggml.tokens").parts[i]).decode() for i in field("tokenizer.ggml.tokens").data]
scores = [float(field("tokenizer.ggml.scores").parts[i][0]) for i in field("tokenizer.ggml.scores").data]
types = [int(field("tokenizer.ggml.token_type").parts[i][0]) for i in field("tokenizer.ggml.token_type").data]
# Gemma's specials: control turn markers, and a user-defined token (always matched).
for text, ty in [("<start_of_turn>", 3), ("<end_of_turn>", 3), ("<mask>", 4)]:
    tokens.append(text)
    scores.append(0.0)
    types.append(ty)

path = os.path.join(out, "gemma-style-vocab.gguf")
w = gguf.GGUFWriter(path, "gemma3")
w.add_tokenizer_model("llama")
w.add_tokenizer_pre("default")
w.add_token_list(tokens)
w.add_token_scores(scores)
w.add_token_types(types)
w.add_bos_token_id(1)
w.add_eos_token_id(2)
w.add_unk_token_id(0)
w.add_add_bos_token(True)
w.add_add_eos_token(False)
w.add_add_space_prefix(False)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()

corpus = []
with open(os.path.join(root, "tests", "data", "pretok", "reference.json")) as f:
    for c in json.load(f):
        if c["text"] not in corpus:
            corpus.append(c["text"])
corpus += ["<start_of_turn>user\nOnce upon a time<end_of_turn>\n<start_of_turn>model\n", " leading space",
           "two  spaces and a<mask>mask", "<end_of_turn>", "naïve café ☕ 🙂 ü"]

cases = []
for text in corpus:
    for ps in (False, True):
        args = [os.path.join(bindir, "llama-tokenize"), "-m", path, "-p", text, "--ids", "--log-disable"]
        if not ps:
            args.append("--no-parse-special")
        r = subprocess.run(args, capture_output=True, text=True, check=True)
        ids = json.loads(r.stdout.strip().splitlines()[-1])
        cases.append({"text": text, "parse_special": ps, "ids": ids})
with open(os.path.join(out, "reference.json"), "w") as f:
    json.dump({"made_by": "tools/scripts/make_spm_fixtures.py", "llama_cpp": "../shared/peers/llama.cpp (81ff7abe50b9)",
               "vocab": "gemma-style-vocab.gguf", "cases": cases}, f, ensure_ascii=False, indent=1)
shutil.rmtree(work)
print("wrote", out, len(cases), "cases")
