#!/usr/bin/python3
# Development tool (needs ../shared/peers and the npm tokenizer packages; the tests only read what
# it writes): makes tests/data/files/reference.json, what llama.cpp does with GGUF files whose
# tokenizer metadata is that of real published files (Qwen 2.5, Qwen 3, Phi-3 in two
# conversions, Llama 3.2, Gemma 3: add_bos_token false and true, BOS/EOS/padding ids, the
# general.name llama.cpp reads Phi-3's rstrip rule from) and whose chat template is the real one.
#   1. per file, a folder as convert_hf_to_gguf.py reads it: the package's tokenizer.json (plus
#      Phi-3's 11 added tokens on Llama 2's vocabulary) and a tokenizer_config.json with the real
#      file's BOS/EOS/padding, add_bos_token/add_eos_token and chat template;
#   2. tandem model synth --preset arch --arch A --vocab-from that --name NAME (Q8_0, peaky);
#   3. llama-server: /tokenize of raw prompts (add_special, with and without parse_special),
#      the prompt tokens /v1/completions reports for each, /apply-template + /tokenize of
#      conversations and the prompt tokens /v1/chat/completions reports, and the greedy
#      continuation of a raw prompt with its top-8 log-probabilities.
# tests/test_real_files.cpp builds the same files from this description and checks tandem
# against every figure.
#   tools/scripts/make_file_fixtures.py BUILD_DIR [PEERS_DIR]
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
out = os.path.join(root, "tests", "data", "files")
os.makedirs(out, exist_ok=True)
work = tempfile.mkdtemp()
packages = vocab_packages(root)
bindir = stage_bin(peers, work)

# Phi-3's added tokens (tokenizer_config.json's added_tokens_decoder): all special.
PHI3_ADDED = [[32000, "<|endoftext|>"], [32001, "<|assistant|>"], [32002, "<|placeholder1|>"],
              [32003, "<|placeholder2|>"], [32004, "<|placeholder3|>"], [32005, "<|placeholder4|>"],
              [32006, "<|system|>"], [32007, "<|end|>"], [32008, "<|placeholder5|>"], [32009, "<|placeholder6|>"],
              [32010, "<|user|>"]]
QWEN_CONFIG = {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
               "add_bos_token": False}
PHI3_CONFIG = {"bos_token": "<s>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "add_eos_token": False}
QWEN_RAW = ["<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>Hello"]
PHI3_RAW = ["<|user|>\nHi<|end|>\n<|assistant|>\n", "<s>Hello </s> world", "<|system|>  \n\tBe brief.<|end|>\n"]
# Each is a real published file's tokenizer metadata (sources: its llama.cpp load log).
FILES = [
    {"name": "qwen2.5", "package": "tokenizer-qwen3", "arch": "qwen2", "template": "qwen2.5.jinja",
     "general_name": "qwen2.5-0.5b-instruct", "config": QWEN_CONFIG, "raw": QWEN_RAW,
     "source": "Qwen/Qwen2.5-0.5B-Instruct-GGUF qwen2.5-0.5b-instruct-q8_0.gguf (add_bos_token false, BOS 151643, EOS 151645, "
               "padding 151643); Qwen 3's vocabulary is Qwen 2.5's plus 4 added tokens"},
    {"name": "qwen3", "package": "tokenizer-qwen3", "arch": "qwen3", "template": "qwen3.jinja",
     "general_name": "Qwen3 0.6B", "config": QWEN_CONFIG, "raw": QWEN_RAW + ["<think>\n\n</think>\n\nHi"],
     "source": "convert_hf_to_gguf.py of Qwen/Qwen3-0.6B (add_bos_token false, BOS 151643, EOS 151645, padding 151643)"},
    {"name": "phi3", "package": "tokenizer-llama2", "arch": "phi3", "template": "phi3.jinja", "added": PHI3_ADDED,
     "general_name": "Phi 3 Mini 4k Instruct", "config": dict(PHI3_CONFIG, add_bos_token=False), "raw": PHI3_RAW,
     "source": "convert_hf_to_gguf.py of a Phi-3 mini whose tokenizer_config.json says add_bos_token false "
               "(Ollama's Phi 3 Mini 128k Instruct: BOS 1, EOS 32000, padding 32000; its name does not match llama.cpp's Phi-3 rstrip rule)"},
    {"name": "phi3-microsoft", "package": "tokenizer-llama2", "arch": "phi3", "template": "phi3.jinja",
     "added": PHI3_ADDED, "general_name": "Phi3", "config": dict(PHI3_CONFIG, add_bos_token=True), "raw": PHI3_RAW,
     "source": "microsoft/Phi-3-mini-4k-instruct-gguf Phi-3-mini-4k-instruct-q4.gguf (general.name Phi3: llama.cpp's rstrip "
               "rule; add_bos_token true, BOS 1, EOS 32000, padding 32000)"},
    {"name": "llama3", "package": "tokenizer-llama3", "arch": "llama", "template": "llama3.2.jinja",
     "general_name": "Llama 3.2 1B Instruct",
     "config": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
     "raw": ["<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
             "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"],
     "source": "Llama-3.2-1B-Instruct GGUF (pre llama-bpe: llama.cpp adds BOS; BOS 128000, EOS 128009)"},
    {"name": "gemma3", "package": "tokenizer-gemma3", "arch": "gemma3", "template": "gemma3.jinja",
     "general_name": "Gemma 3 1b It",
     "config": {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "add_bos_token": True,
                "add_eos_token": False},
     "raw": ["<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", "<bos>Hello"],
     "source": "gemma-3-1b-it-Q4_K_M.gguf (add_bos_token true, BOS 2, EOS 1, padding 0, add_space_prefix false)"},
]
COMMON_RAW = ["Hello world", " Hello  world\n", "a\n\n<tag> b"]
CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "  Name a colour.  "},
     {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another, in 日本語?"}],
]
SYNTH = {"preset": "arch", "dtype": "q8_0", "seed": 5, "output_scale": 8}
TOP_K = 8
STEPS = 12


def prepare(f, folder):
    """The folder convert_hf_to_gguf.py would read: tokenizer.json and tokenizer_config.json."""
    src = os.path.join(packages, f["package"], "models")
    with open(os.path.join(src, "tokenizer.json")) as fh:
        tj = json.load(fh)
    for i, text in f.get("added", []):
        tj["added_tokens"].append({"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
                                   "normalized": False, "special": True})
    with open(os.path.join(src, "tokenizer_config.json")) as fh:
        cfg = json.load(fh)
    for k in ("bos_token", "eos_token", "pad_token", "add_bos_token", "add_eos_token"):
        cfg.pop(k, None)
    cfg.update(f["config"])
    with open(os.path.join(root, "tests", "data", "templates", f["template"])) as fh:
        cfg["chat_template"] = fh.read()
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "tokenizer.json"), "w") as fh:
        json.dump(tj, fh, ensure_ascii=False)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as fh:
        json.dump(cfg, fh, ensure_ascii=False)
    return os.path.join(folder, "tokenizer.json")


result = {"made_by": "tools/scripts/make_file_fixtures.py", "llama_cpp": "../shared/peers/llama.cpp (81ff7abe50b9)",
          "synth": SYNTH, "files": []}
for f in FILES:
    tj_path = prepare(f, os.path.join(work, f["name"]))
    path = os.path.join(work, f["name"] + ".gguf")
    subprocess.run([os.path.join(build, "tools", "tandem"), "model", "synth", "--preset", SYNTH["preset"], "--arch", f["arch"],
                    "--dtype", SYNTH["dtype"], "--seed", str(SYNTH["seed"]), "--output-scale", str(SYNTH["output_scale"]),
                    "--vocab-from", tj_path, "--name", f["general_name"], "--out", path], check=True, capture_output=True)
    banned = not_utf8_alone(tj_path)  # llama-server's stream fails on text that is not UTF-8
    bias = [[b, False] for b in banned]
    port = free_port()
    srv = subprocess.Popen([os.path.join(bindir, "llama-server"), "-m", path, "-t", "2", "-c", "512", "-np", "1",
                            "-ctk", "f32", "-ctv", "f32", "-fa", "off", "--jinja", "--port", str(port)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    entry = {k: f[k] for k in ("name", "package", "arch", "template", "general_name", "config", "source")}
    entry["added"] = f.get("added", [])
    entry["banned"] = banned
    entry["raw"], entry["chat"] = [], []
    try:
        wait_healthy(port)
        for text in COMMON_RAW + f["raw"]:
            case = {"text": text}
            for ps in (True, False):
                ids = json.load(post(port, "/tokenize", {"content": text, "add_special": True, "parse_special": ps}))["tokens"]
                case["ids" if ps else "ids_literal"] = ids
            # What the completions endpoint prefills for it (one token generated).
            r = json.load(post(port, "/v1/completions", {"prompt": text, "max_tokens": 1, "temperature": 0,
                                                          "logit_bias": bias}))
            case["completions_prompt_tokens"] = r["usage"]["prompt_tokens"]
            entry["raw"].append(case)
        for msgs in CONVERSATIONS:
            prompt = json.load(post(port, "/apply-template", {"messages": msgs, "add_generation_prompt": True}))["prompt"]
            ids = json.load(post(port, "/tokenize", {"content": prompt, "add_special": True, "parse_special": True}))["tokens"]
            r = json.load(post(port, "/v1/chat/completions", {"messages": msgs, "max_tokens": 1, "temperature": 0,
                                                               "logit_bias": bias}))
            entry["chat"].append({"messages": msgs, "prompt": prompt, "ids": ids,
                                  "chat_prompt_tokens": r["usage"]["prompt_tokens"]})
        # The greedy continuation of the client-templated prompt, as /completion tokenizes it.
        text = f["raw"][0]
        ids = json.load(post(port, "/tokenize", {"content": text, "add_special": True, "parse_special": True}))["tokens"]
        body = {"prompt": text, "n_predict": STEPS, "n_probs": TOP_K, "temperature": 0, "logit_bias": bias,
                "cache_prompt": False}
        entry["greedy"] = {"text": text, "ids": ids, "steps": stream_completion(port, body)}
        print(f"{f['name']}: {len(entry['raw'])} raw prompts, {len(entry['chat'])} conversations, "
              f"{len(entry['greedy']['steps'])} greedy steps, {len(banned)} banned")
    finally:
        srv.terminate()
        srv.wait()
    result["files"].append(entry)

with open(os.path.join(out, "reference.json"), "w") as fh:
    json.dump(result, fh, ensure_ascii=False, indent=1)
shutil.rmtree(work)
print("wrote", out)
