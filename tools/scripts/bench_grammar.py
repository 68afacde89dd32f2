#!/usr/bin/env python3
"""What constrained decoding costs per token, as served: TPOT with a nested JSON schema against
TPOT without one, on the same server, in interleaved rounds.

Each round sends, per seed, a request constrained by the schema (it ends where the JSON is
complete: n tokens) and the same request unconstrained, made to generate exactly n tokens
(ignore_eos), in alternating order. TPOT is the server's own figure (the `tandem.tpot_ms` of
each response). The first constrained request meets an empty mask cache (cold); it is shown
apart. Medians of the rounds; the ratio is constrained / unconstrained.

Usage: bench_grammar.py TANDEM_BINARY MODEL.gguf [--rounds 5] [--seeds 8] [--mode colocated]
                        [--llama-server PATH]  (the same measurement of llama-server, after tandem's)
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.request

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "year": {"type": "integer"},
        "chapters": {
            "type": "array", "minItems": 2, "maxItems": 5,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 30},
                    "pages": {"type": "integer"},
                    "people": {
                        "type": "array", "maxItems": 3,
                        "items": {
                            "type": "object",
                            "properties": {
                                "name": {"type": "string", "maxLength": 20},
                                "role": {"enum": ["hero", "villain", "friend"]},
                                "age": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                            },
                            "required": ["name", "role"],
                        },
                    },
                },
                "required": ["name", "pages", "people"],
            },
        },
    },
    "required": ["title", "year", "chapters"],
}


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def measure(name, port, start_cmd, rf_fields, tpot_of, a):
    srv = subprocess.Popen(start_cmd, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except Exception:
                time.sleep(0.1)
        base = {"prompt": "Once upon a time", "temperature": 0.8, "max_tokens": a.max_tokens}

        def constrained(seed):
            return post(port, {**base, "seed": seed, **rf_fields})

        def plain(seed, n):
            return post(port, {**base, "seed": seed, "max_tokens": n, "ignore_eos": True})

        cold = tpot_of(constrained(10_000))  # the first use of the schema: no masks cached
        lengths = [constrained(seed)["usage"]["completion_tokens"] for seed in range(a.seeds)]
        with_g, without_g, valid = [], [], 0
        for rnd in range(a.rounds):
            tw, tn = [], []
            for seed in range(a.seeds):
                if (rnd + seed) % 2 == 0:
                    c, p = constrained(seed), plain(seed, lengths[seed])
                else:
                    p, c = plain(seed, lengths[seed]), constrained(seed)
                if c["choices"][0]["finish_reason"] == "stop":
                    json.loads(c["choices"][0]["text"])
                    valid += 1
                tw.append(tpot_of(c))
                tn.append(tpot_of(p))
            with_g.append(statistics.median(tw))
            without_g.append(statistics.median(tn))
        mw, mn = statistics.median(with_g), statistics.median(without_g)
        print(f"{name}: {a.rounds} rounds x {a.seeds} seeds; answers {min(lengths)}..{max(lengths)} tokens; "
              f"{valid} complete answers parsed as JSON")
        print(f"  TPOT with the schema   {mw:.4f} ms (rounds: {' '.join(f'{x:.4f}' for x in with_g)})")
        print(f"  TPOT without           {mn:.4f} ms (rounds: {' '.join(f'{x:.4f}' for x in without_g)})")
        print(f"  ratio                  {mw / mn:.3f}")
        print(f"  cold first request     {cold:.4f} ms/token (nothing cached)")
    finally:
        srv.terminate()
        srv.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tandem")
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--port", type=int, default=18931)
    ap.add_argument("--max-tokens", type=int, default=480)
    ap.add_argument("--mode", default="disaggregated", choices=["disaggregated", "colocated"])
    ap.add_argument("--llama-server", help="also measure this llama-server binary (its json_schema field), 2 threads")
    a = ap.parse_args()
    print(f"model {a.model}")
    rf = {"type": "json_schema", "json_schema": {"name": "book", "schema": SCHEMA}}
    measure(f"tandem ({a.mode})", a.port,
            [a.tandem, "serve", "--model", a.model, "--port", str(a.port), "--mode", a.mode],
            {"response_format": rf}, lambda r: r["tandem"]["tpot_ms"], a)
    if a.llama_server:
        # llama-server's /v1/completions ignores response_format; its own json_schema field works.
        measure("llama-server", a.port + 1,
                [a.llama_server, "-m", a.model, "-t", "2", "-c", "1024", "--port", str(a.port + 1)],
                {"json_schema": SCHEMA}, lambda r: r["timings"]["predicted_per_token_ms"], a)


if __name__ == "__main__":
    sys.exit(main())
