#!/usr/bin/env bash
# End-to-end checks of the `tandem` binary: stdout carries exactly the continuation, --json is
# one object, bad flags and bad files give clear errors and a non-zero exit.
#   test_cli.sh TANDEM_BINARY TEST_DATA_DIR
set -uo pipefail
bin=$1
data=$2
model=$data/stories260K.gguf
ref=$data/stories260K-reference.txt
src=$(cd "$(dirname "$0")/.." && pwd)  # the repository (docs/)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export TANDEM_CACHE_DIR=$work/cache
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
pass() { echo "ok: $*"; }

[ -f "$model" ] || { echo "FAIL: missing test data $model (tests/data)"; exit 1; }

# 1. Greedy continuation on stdout equals the reference text byte for byte (plus the final newline).
"$bin" generate --model "$model" --prompt "Once upon a time" -n 64 --temperature 0 >"$work/out.txt" 2>"$work/err.txt"
sed -n '/BEGIN>>>/,/<<<END/p' "$ref" | sed '1s/^.*BEGIN>>>//; $s/<<<END.*$//' >"$work/expected.txt"
if cmp -s "$work/out.txt" "$work/expected.txt"; then pass "generate stdout equals the reference"
else fail "generate stdout differs:"; diff "$work/out.txt" "$work/expected.txt" | head; fi
grep -q "tokens generated" "$work/err.txt" && pass "logs go to stderr" || fail "no log line on stderr"

# 2. --json prints one object with the ids, the text and the timings.
"$bin" generate --model "$model" --prompt "Once upon a time" -n 8 --temperature 0 --json >"$work/out.json" 2>/dev/null
for key in '"prompt_token_ids":\[1,403,407,261,378\]' '"token_ids":\[432,383,286,261,376,298,315,421\]' \
           '"text":", there was a little girl"' '"prefill_ms":' '"decode_ms_per_token":'; do
  grep -Eq "$key" "$work/out.json" && pass "json has $key" || fail "json lacks $key: $(cat "$work/out.json")"
done
[ "$(wc -l <"$work/out.json")" -eq 1 ] && pass "json is one line" || fail "json is not one line"

# 2b. With no --model: the built-in default, stories260K, written once to the cache directory,
# answers with the same readable text; its bytes are the committed file's.
"$bin" generate --prompt "Once upon a time" -n 64 --temperature 0 >"$work/default.txt" 2>"$work/default.err"
cmp -s "$work/default.txt" "$work/expected.txt" && pass "the built-in default model tells the reference story" \
  || fail "default model's text differs: $(head -c 300 "$work/default.txt") $(tail -3 "$work/default.err")"
cmp -s "$TANDEM_CACHE_DIR/stories260K.gguf" "$model" && pass "the default model in the cache is stories260K" \
  || fail "no stories260K.gguf in $TANDEM_CACHE_DIR"
# Its chat: the user's words open a story (its own template), readable text back.
"$bin" serve --port 0 >"$work/serve.log" 2>&1 &
srv=$!
port=
for _ in $(seq 200); do
  port=$(sed -n 's|.*serving model .* on http://127.0.0.1:\([0-9]*\).*|\1|p' "$work/serve.log")
  [ -n "$port" ] && break; sleep 0.1
done
reply=$(curl -s --max-time 20 "http://127.0.0.1:$port/v1/chat/completions" \
  -d '{"messages":[{"role":"user","content":"Tell me a story."}],"max_tokens":40,"temperature":0}')
kill "$srv" 2>/dev/null; wait "$srv" 2>/dev/null
python3 - "$reply" <<'PY' && pass "the default model's chat answer is words" || fail "default chat answer: $reply"
import json, re, sys
d = json.loads(sys.argv[1])
assert d["model"] == "stories260K", d["model"]
text = d["choices"][0]["message"]["content"]
words = re.findall(r"[A-Za-z]+", text)
# Readable: mostly letters and spaces, at least 20 words, a sentence ended.
assert len(words) >= 20 and "." in text and "\ufffd" not in text, text
assert d["usage"]["prompt_tokens"] < 20, d["usage"]  # the template's few tokens, no spelled-out markers
PY

# 3. Seeded sampling is reproducible.
a=$("$bin" generate --model "$model" --prompt "Once" -n 20 --temperature 1 --seed 11 2>/dev/null)
b=$("$bin" generate --model "$model" --prompt "Once" -n 20 --temperature 1 --seed 11 2>/dev/null)
[ "$a" = "$b" ] && pass "same seed, same text" || fail "seeded runs differ"

# 4. Bad flags and bad inputs: non-zero exit and a message naming the problem.
expect_error() {  # expect_error PATTERN ARGS...
  local pat=$1; shift
  if "$bin" "$@" >"$work/o" 2>"$work/e"; then fail "'$*' succeeded"; return; fi
  grep -qi -- "$pat" "$work/e" && pass "'$*' -> $pat" || fail "'$*' error lacks '$pat': $(cat "$work/e")"
}
expect_error "temperature" generate --model "$model" --prompt x --temperature -1
expect_error "top-p" generate --model "$model" --prompt x --top-p 1.5
expect_error "not a GGUF file" generate --model "$ref" --prompt x
expect_error "cannot open" generate --model /nonexistent.gguf --prompt x
expect_error "prompt" generate --model "$model"
expect_error "frobnicate" frobnicate
expect_error "preset" model synth --preset nope --out "$work/x.gguf"
# One rule with the server: a prompt longer than the context is refused; a generation that
# reaches the end of the context stops there ("length"): prompt + output = n_ctx + 1 (512 + 1).
expect_error "context length" generate --model "$model" --prompt "$(printf 'the cat %.0s' $(seq 400))" -n 4
full=$("$bin" generate --model "$model" --prompt x -n 100000 --temperature 0 --ignore-eos --json 2>/dev/null)
n_out=$(printf '%s' "$full" | grep -o '"token_ids":\[[^]]*\]' | tr ',' '\n' | wc -l)
n_in=$(printf '%s' "$full" | grep -o '"prompt_token_ids":\[[^]]*\]' | tr ',' '\n' | wc -l)
[ $((n_in + n_out)) -eq 513 ] && printf '%s' "$full" | grep -q '"finish_reason":"length"' \
  && pass "generate -n past the context stops at it ($n_in + $n_out)" \
  || fail "generate -n past the context: $n_in + $n_out tokens, want 513"
printf 'GGUF\3\0\0\0' >"$work/trunc.gguf"
expect_error "truncated" model inspect "$work/trunc.gguf"
expect_error "is not http" bench serve --url nope
expect_error "connection refused" bench serve --url http://127.0.0.1:1 --requests 1
echo '{"arrival_s": 0}' >"$work/bad.jsonl"
expect_error "bad.jsonl:1: 'prompt'" bench compare --trace "$work/bad.jsonl" --slo-tpot 10
expect_error "slo" bench compare --trace short
expect_error "matmul" generate --model "$model" --prompt x --matmul slow
expect_error "kv-dtype" generate --model "$model" --prompt x --kv-dtype q4
expect_error "no llama-bench in" bench kernels --against-llama-bench "$work" --dtypes q8_0 --threads 1 --rounds 1
# Beside a stand-in llama-bench (prefill 100 tok/s at 1 thread, 150 at 2; decode 10): every
# 2-thread row carries its prefill scaling, the median of each round's 2-thread / 1-thread pair.
mkdir -p "$work/fakellama"
cat >"$work/fakellama/llama-bench" <<'SH'
#!/bin/sh
[ "$1" = --help ] && exit 0
while [ $# -gt 0 ]; do case $1 in -p) p=$2;; -t) t=$2;; esac; shift; done
if [ "$p" != 0 ]; then echo "[{\"avg_ts\": $((t == 1 ? 100 : 150))}]"; else echo '[{"avg_ts": 10}]'; fi
SH
chmod +x "$work/fakellama/llama-bench"
"$bin" bench kernels --against-llama-bench "$work/fakellama" --model "$model" --threads 1,2 --prompt-tokens 32 --matmul batch-invariant \
  --decode-tokens 2 --rounds 3 --json >"$work/scaling.json" 2>"$work/scaling.err"
python3 - "$work/scaling.json" <<'PY' && pass "bench kernels --against-llama-bench: prefill scaling per thread count" \
  || fail "bench kernels scaling: $(cat "$work/scaling.json" "$work/scaling.err")"
import json, sys
rows = json.load(open(sys.argv[1]))
one = [r for r in rows if r["threads"] == 1]
two = [r for r in rows if r["threads"] == 2]
assert len(one) == 1 and len(two) == 1, rows
assert "tandem_prefill_scaling" not in one[0] and "llama_prefill_scaling" not in one[0], one
assert two[0]["llama_prefill_scaling"] == 1.5, two
assert two[0]["prefill_ratio"] > 0 and two[0]["tandem_prefill_scaling"] > 0, two
PY
expect_error "kv-store-disk-mib" serve --model "$model" --port 0 --kv-store-disk "$work/tier.bin"
expect_error "cannot open /nonexistent/tier.bin" serve --model "$model" --port 0 --kv-store-disk /nonexistent/tier.bin --kv-store-disk-mib 4
expect_error "route-load-weight" serve --model "$model" --port 0 --route-load-weight -1
expect_error "multiturn needs --api ws" bench serve --url http://127.0.0.1:1 --trace multiturn
# Several processes: roles and --join are checked before anything starts.
expect_error "needs HOST:PORT" serve --model "$model" --role decode
expect_error "has no valid port" serve --model "$model" --role prefill --join 127.0.0.1:notaport
expect_error "is for --role prefill or decode" serve --model "$model" --port 0 --join 127.0.0.1:7070
expect_error "cannot reach the router at 127.0.0.1:1" serve --model "$model" --role decode --join 127.0.0.1:1
expect_error "role" serve --model "$model" --role middle
expect_error "is for --mode disaggregated" serve --model "$model" --port 0 --mode colocated --share-cores
expect_error "needs --share-cores" serve --model "$model" --port 0 --decode-pace-ms 10
expect_error "modes" bench compare --trace short --slo-tpot 10 --modes colocated,sideways
expect_error "more names than" bench compare --trace short --slo-tpot 10 --against-name a
expect_error "rounds needs --rates" bench compare --trace short --slo-tpot 10 --rounds 3
expect_error "run them apart" bench compare --trace short --slo-tpot 10 --rounds 3 --rates 1 --with-chaos
expect_error "two contenders have one name" bench compare --trace short --slo-tpot 10 --against http://127.0.0.1:1 --against-name shared --modes shared
expect_error "disaggregated" serve --model "$model" --role router --mode colocated --port 0

# 5. Through the actor runtime: every concurrent request equals the lone-engine reference.
for mode in disaggregated colocated; do
  "$bin" generate --model "$model" --prompt "Once upon a time" -n 64 --temperature 0 --mode $mode \
    --decode-workers 2 --concurrency 4 --json >"$work/pipe.json" 2>"$work/pipe.err"
  n=$(grep -o '"text":", there was a little girl named Lily. She loved to play outside in the park.' "$work/pipe.json" | wc -l)
  [ "$n" -eq 4 ] && pass "$mode: 4 of 4 requests equal the reference" || fail "$mode: $n of 4 equal the reference: $(head -c 600 "$work/pipe.json")"
  grep -q '"ttft_ms"' "$work/pipe.json" && grep -q '"tandem_request_ttft_seconds"' "$work/pipe.json" \
    && pass "$mode: timings and metrics in json" || fail "$mode: timings/metrics missing"
done
printf 'Once upon a time\nThe cat\n' >"$work/prompts.txt"
"$bin" generate --model "$model" --prompts-file "$work/prompts.txt" -n 8 --mode colocated >"$work/pf.txt" 2>/dev/null \
  && [ "$(grep -c '^--- request' "$work/pf.txt")" -eq 2 ] && pass "prompts file" || fail "prompts file: $(cat "$work/pf.txt")"
expect_error "need --mode" generate --model "$model" --prompt x --concurrency 2

# 6. --help on every subcommand.
for cmd in "" "generate" "model" "model synth" "model inspect" "bench" "bench kernels" "serve"; do
  # shellcheck disable=SC2086
  "$bin" $cmd --help >/dev/null 2>&1 && pass "help: tandem $cmd" || fail "tandem $cmd --help"
done
# 6b. bench and chaos live in tandem-bench beside the binary: `tandem bench ...` runs it with the
# same command line (global flags first included); without it, the error says how to build it.
"$bin" bench kernels --help 2>&1 | grep -q -- "--against-llama-bench" && pass "tandem bench kernels --help reaches tandem-bench" \
  || fail "tandem bench kernels --help: $("$bin" bench kernels --help 2>&1 | head -3)"
"$bin" --help | grep -q "chaos.*(in tandem-bench)" && pass "tandem --help lists chaos" || fail "tandem --help lacks chaos"
"$bin" --log-level warn chaos --url http://127.0.0.1:1 >"$work/chaos.txt" 2>&1
grep -q "admin-key" "$work/chaos.txt" && pass "tandem --log-level warn chaos: flags reach tandem-bench" \
  || fail "global flag before chaos: $(cat "$work/chaos.txt")"
mkdir "$work/alone" && cp "$bin" "$work/alone/tandem"
"$work/alone/tandem" bench kernels >"$work/alone.txt" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "tandem bench is in tandem-bench, which is not built.*--target tandem-bench" "$work/alone.txt" \
  && pass "tandem bench without tandem-bench: exit 2 and how to build it" || fail "no tandem-bench: rc $rc $(cat "$work/alone.txt")"

# 7. synth + inspect round trip, and the default model path.
"$bin" model synth --preset tiny --dtype q8_0 --out "$work/tiny.gguf" 2>/dev/null || fail "synth"
"$bin" model inspect "$work/tiny.gguf" --json >"$work/inspect.json" 2>/dev/null || fail "inspect"
grep -q '"n_kv_head": 2' "$work/inspect.json" && grep -q '"q8_0"' "$work/inspect.json" && pass "inspect json" \
  || fail "inspect json: $(cat "$work/inspect.json")"
"$bin" model inspect "$model" | grep -q "llama" && pass "inspect text" || fail "inspect text"
# A file tandem cannot serve is still inspected: an unknown architecture (every "llama" of the
# tiny file becomes "mamba", keys included) and a tensor retyped as Q2_K (type 10) are named.
perl -0777 -pe 's/llama/mamba/g; s/(output_norm\.weight\x01\0\0\0.{8})\0\0\0\0/$1\x0a\0\0\0/s' \
  <"$work/tiny.gguf" >"$work/mamba.gguf"
"$bin" model inspect "$work/mamba.gguf" >"$work/mamba.txt" 2>&1 || fail "inspect of an unsupported file exits 0"
grep -q "architecture 'mamba'" "$work/mamba.txt" && grep -q "'output_norm.weight' (Q2_K, type 10)" "$work/mamba.txt" \
  && grep -q "cannot serve" "$work/mamba.txt" && pass "inspect names what tandem lacks" \
  || fail "inspect of an unsupported file: $(cat "$work/mamba.txt")"
"$bin" model inspect "$work/mamba.gguf" --json 2>/dev/null | grep -q '"loads": false' && pass "inspect json: loads false" \
  || fail "inspect json of an unsupported file"
for a in qwen2 qwen3 gemma3 phi3; do
  "$bin" model synth --preset arch --arch $a --dtype q8_0 --out "$work/$a.gguf" 2>/dev/null || fail "synth --arch $a"
  "$bin" model inspect "$work/$a.gguf" | grep -q "architecture   $a, .*(supported)" && pass "inspect $a" || fail "inspect $a"
  "$bin" generate --model "$work/$a.gguf" --prompt "Once" -n 4 --temperature 0 --json 2>/dev/null | grep -q '"token_ids":\[' \
    && pass "generate on a $a synth" || fail "generate on a $a synth"
done

# 7b. 4-6 bit types: synth refuses widths the block does not divide, a k-quant synth loads and
# generates, and llama.cpp's own Q4_K_M file (tests/data/kquant) is served over HTTP.
expect_error "multiples of 256" model synth --preset tiny --dtype q4_k --out "$work/x.gguf"
"$bin" model synth --preset kquant --dtype q5_k --out "$work/kq5.gguf" 2>/dev/null || fail "synth q5_k"
"$bin" model inspect "$work/kq5.gguf" | grep -q "q5_k" && pass "inspect shows q5_k" || fail "inspect q5_k"
"$bin" bench kernels --model "$work/kq5.gguf" --threads 1 --prompt-tokens 32 --decode-tokens 4 --matmul batch-invariant \
  --json 2>/dev/null | grep -q '"dtype": *"q5_k"' && pass "bench kernels --model: rows labelled by the file's type" \
  || fail "bench kernels --model label"
expect_error "excludes" bench kernels --model "$work/kq5.gguf" --dtypes q8_0
# TANDEM_ISA caps the matmul level: the AVX2 integer kernels (or scalar) serve the same file.
for level in avx2 scalar; do
  TANDEM_ISA=$level "$bin" bench kernels --model "$work/kq5.gguf" --threads 1 --prompt-tokens 32 --decode-tokens 4 \
    --matmul batch-invariant --json 2>/dev/null | grep -q "\"isa\": *\"$level\"" && pass "TANDEM_ISA=$level runs" \
    || fail "TANDEM_ISA=$level"
done
"$bin" generate --model "$work/kq5.gguf" --prompt "Once" -n 8 --temperature 0 --json 2>/dev/null | grep -q '"token_ids":\[' \
  && pass "generate on a q5_k synth" || fail "generate on a q5_k synth"
kq=$data/kquant/kq-Q4_K_M.gguf
"$bin" serve --port 0 --model "$kq" --mode colocated >"$work/kq.out" 2>"$work/kq.err" &
kpid=$!
# Servers get up to 60 s to start (they break out as soon as they serve): on a loaded 2-core
# machine the earlier 10 s ran out and every check after it failed with an empty port.
for _ in $(seq 1 600); do grep -q "serving model" "$work/kq.err" && break; sleep 0.1; done
kport=$(grep -o "http://127.0.0.1:[0-9]*" "$work/kq.err" | head -1 | sed 's/.*://')
kmodel=$(curl -s "127.0.0.1:$kport/v1/models" | grep -o '"id":"[^"]*"' | head -1 | sed 's/"id":"//; s/"$//')
curl -s "127.0.0.1:$kport/v1/completions" -d "{\"model\":\"$kmodel\",\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"temperature\":0}" \
  >"$work/kq.json"
grep -q '"completion_tokens":8' "$work/kq.json" && pass "serve answers on llama.cpp's Q4_K_M file" \
  || fail "serve on Q4_K_M: $(cat "$work/kq.json") $(cat "$work/kq.err")"
kill -TERM "$kpid"; wait "$kpid" || true

# 8. serve: flags from a config file (the port it binds is logged), bad flags and files refused.
printf '[serve]\nport = 0\nmodel = "%s"\nmode = "colocated"\n' "$work/tiny.gguf" >"$work/serve.toml"
"$bin" serve --config "$work/serve.toml" >"$work/serve.out" 2>"$work/serve.err" &
spid=$!
for _ in $(seq 1 600); do grep -q "serving model" "$work/serve.err" && break; sleep 0.1; done
grep -q "serving model 'tiny' (colocated mode" "$work/serve.err" && pass "serve reads --config" \
  || fail "serve --config: $(cat "$work/serve.err")"
kill -TERM "$spid"; wait "$spid" && pass "serve exits 0 on SIGTERM" || fail "serve exit status on SIGTERM"
"$bin" serve --port 70000 >/dev/null 2>"$work/err.txt" && fail "serve --port 70000 accepted" \
  || { grep -qi "port" "$work/err.txt" && pass "serve rejects a bad port" || fail "serve bad port message: $(cat "$work/err.txt")"; }
"$bin" serve --config "$work/nope.toml" >/dev/null 2>"$work/err.txt" && fail "missing config accepted" \
  || pass "serve rejects a missing config file"
"$bin" serve --host not-an-ip --port 0 --model "$work/tiny.gguf" >/dev/null 2>"$work/err.txt" && fail "bad host accepted" \
  || { grep -q "bad --host" "$work/err.txt" && pass "serve rejects a bad host" || fail "serve bad host: $(cat "$work/err.txt")"; }

# 8b. Configuration: --help shows defaults; a config file's unknown key or bad value is refused
# naming it, as on the command line; --print-config writes the effective configuration as a
# file --config reads back.
"$bin" serve --help >"$work/help.txt"
grep -Eq -- '--prefill-workers INT:INT in \[1 - 256\]=1' "$work/help.txt" \
  && grep -Eq -- '--port INT:INT in \[0 - 65535\]=8080' "$work/help.txt" \
  && pass "serve --help shows defaults" || fail "serve --help defaults: $(head -30 "$work/help.txt")"
printf '[serve]\nport = 0\nbogus-key = 3\n' >"$work/unknown.toml"
"$bin" --config "$work/unknown.toml" serve >/dev/null 2>"$work/err.txt" && fail "unknown config key accepted" \
  || { grep -q "bogus-key" "$work/err.txt" && pass "an unknown config key is refused by name" || fail "unknown key: $(cat "$work/err.txt")"; }
printf '[serve]\nport = "abc"\n' >"$work/badval.toml"
"$bin" --config "$work/badval.toml" serve >/dev/null 2>"$work/err.txt" && fail "bad config value accepted" \
  || { grep -q -- "--port" "$work/err.txt" && pass "a bad config value is refused by name" || fail "bad value: $(cat "$work/err.txt")"; }
"$bin" serve --mode colocated --max-batch 17 --print-config >"$work/printed.toml" 2>"$work/err.txt" \
  && grep -qx '\[serve\]' "$work/printed.toml" && grep -qx 'max-batch=17' "$work/printed.toml" \
  && grep -qx 'mode="colocated"' "$work/printed.toml" && ! grep -q 'print-config' "$work/printed.toml" \
  && pass "serve --print-config" || fail "print-config: $(cat "$work/printed.toml" "$work/err.txt")"
sed -i 's/^port=8080$/port=0/' "$work/printed.toml"
"$bin" --config "$work/printed.toml" serve --model "$model" >"$work/pc.out" 2>"$work/pc.err" &
pcpid=$!
for _ in $(seq 1 600); do grep -q "serving model" "$work/pc.err" && break; sleep 0.1; done
grep -q "serving model 'stories260K' (colocated mode" "$work/pc.err" && pass "a printed config reads back" \
  || fail "printed config read back: $(cat "$work/pc.err")"
kill -TERM "$pcpid"; wait "$pcpid" || true

# 9. tandem chaos against a served model in both modes: kills land, nothing is lost, duplicated
# or leaked, and the report carries the server's memory and descriptors (sampled from /metrics).
for mode in disaggregated colocated; do
  "$bin" serve --port 0 --model "$model" --mode $mode --admin-key k9 >"$work/c.out" 2>"$work/c.err" &
  cpid=$!
  for _ in $(seq 1 600); do grep -q "serving model" "$work/c.err" && break; sleep 0.1; done
  cport=$(grep -o "http://127.0.0.1:[0-9]*" "$work/c.err" | head -1 | sed 's/.*://')
  curl -s "127.0.0.1:$cport/metrics" | grep -Eq '^process_resident_memory_bytes [1-9]' \
    && pass "$mode: /metrics has process_resident_memory_bytes" || fail "$mode: no process memory gauge"
  "$bin" chaos --url "http://127.0.0.1:$cport" --admin-key k9 --for 3s --every 600ms --concurrency 8 --json \
    >"$work/chaos.json" 2>"$work/chaos.err"
  python3 - "$work/chaos.json" <<'PY' && pass "$mode: chaos report $(cat "$work/chaos.json")" || fail "$mode: chaos $(cat "$work/chaos.json" "$work/chaos.err")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["ok"] and r["lost"] == 0 and r["duplicated_tokens"] == 0 and r["leaked_blocks"] == 0, r
assert r["kills"] >= 2 and r["finished"] > 0, r
for k in ("server_resident_bytes", "server_open_fds"):
    t = r[k]
    assert 0 < t["start"] <= t["peak"] and 0 < t["end"] <= t["peak"], (k, t)
PY
  kill -TERM "$cpid"; wait "$cpid" || true
done

# 10. The operator's log (--log-format json: every line one JSON object): the start banner, a
# line per request that ended (served or refused), a kill, the restart it caused, the worker's
# loss and return with its recovery time, and the periodic stats line.
"$bin" --log-format json serve --port 0 --model "$model" --admin-key k9 --stats-interval-s 0.2 \
  >"$work/log.out" 2>"$work/log.err" &
lpid=$!
for _ in $(seq 1 600); do grep -q "serving model" "$work/log.err" && break; sleep 0.1; done
lport=$(grep -o "http://127.0.0.1:[0-9]*" "$work/log.err" | head -1 | sed 's/.*://')
curl -s "127.0.0.1:$lport/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":8,"temperature":0}' >/dev/null
curl -s "127.0.0.1:$lport/v1/completions" -d '{"prompt":"Once","max_tokens":8,"bogus":1}' >/dev/null
curl -s -H "Authorization: Bearer k9" "127.0.0.1:$lport/admin/kill" -d '{"kind":"decode"}' >/dev/null
sleep 0.5
curl -s "127.0.0.1:$lport/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":8,"stream":true}' >/dev/null
sleep 0.5
curl -s "127.0.0.1:$lport/metrics" >"$work/log.metrics"
kill -TERM "$lpid"; wait "$lpid" || true
# The Grafana dashboard in docs/ queries only metrics /metrics exports, and docs/metrics.md
# names every metric it exports (the ones this run made: requests, a kill, a restart).
python3 - "$work/log.metrics" "$src/docs/grafana/tandem-dashboard.json" "$src/docs/metrics.md" <<'PY' \
  && pass "grafana queries and the metrics reference match /metrics" || fail "grafana/metrics reference: see above"
import json, re, sys
exported = set(re.findall(r"^# TYPE (\S+) ", open(sys.argv[1]).read(), re.M))
assert "tandem_build_info" in exported and "tandem_model_info" in exported and "tandem_requests" in exported, exported
dash = json.load(open(sys.argv[2]))
missing = set()
for p in dash["panels"]:
    for t in p["targets"]:
        for name in re.findall(r"\b((?:tandem|process)_[a-z_]+)\b", t["expr"]):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            if base not in exported: missing.add(name)
assert not missing, f"dashboard queries metrics /metrics does not export: {sorted(missing)}"
doc = open(sys.argv[3]).read()
undocumented = sorted(n for n in exported if n.startswith("tandem_") and f"`{n}`" not in doc)
assert not undocumented, f"docs/metrics.md lacks {undocumented}"
PY
python3 - "$work/log.err" <<'PY' && pass "json logs: banner, requests, kill, restart, recovery, stats" || fail "json logs: $(cat "$work/log.err")"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]  # every line must parse
assert all("ts" in l and "level" in l for l in lines), lines
ev = lambda name: [l for l in lines if l.get("event") == name]
start = ev("start")[0]
assert start["kv_dtype"] == "f16" and start["port"] > 0 and start["admin"] is True and start["architecture"] == "llama", start
reqs = ev("request")
ok = [r for r in reqs if r.get("status") == 200]
assert len(ok) == 2 and {r["protocol"] for r in ok} == {"json", "sse"}, reqs
for r in ok:
    assert r["endpoint"] == "/v1/completions" and r["output_tokens"] == 8 and r["finish"] == "length", r
    assert r["ttft_ms"] >= 0 and r["e2e_ms"] > 0 and r["decode_worker"] == "decode-0", r
    # The default (auto): a short prompt is computed by its decode worker (no KV moved), or by
    # the prefill worker when it does not fit that worker's slack (before its steps are
    # measured, two blocks).
    assert (r["prefill_worker"], r["kv_bytes"] > 0) in {("decode-0", False), ("prefill-0", True)}, r
    assert r["prompt_tokens"] > 0 and r["ref"].startswith("cmpl-"), r
bad = [r for r in reqs if r.get("status") == 400]
assert len(bad) == 1 and bad[0]["error"] == "invalid_argument" and "bogus" in bad[0]["message"], reqs
assert ev("kill")[0]["actor"] == "decode-0" and ev("kill")[0]["by"] == "/admin/kill", ev("kill")
assert any(r["actor"] == "decode-0" and r["reason"] == "killed" for r in ev("restart")), ev("restart")
assert ev("worker_down")[0]["worker"] == "decode-0", ev("worker_down")
assert ev("worker_joined")[0]["worker"] == "decode-0" and ev("worker_joined")[0]["recovery_ms"] >= 0, ev("worker_joined")
assert any(s["output_tokens_per_s"] > 0 for s in ev("stats")), ev("stats")
assert any("msg" in l and "serving model" in l["msg"] for l in lines), "free-form lines are JSON too"
PY
grep -Eq '^\[[0-9:.]+\] \[info\] request id=1 ref=cmpl-1 endpoint=/v1/completions protocol=json status=200 .*prefill_worker=colocated-0 decode_worker=colocated-0 ' "$work/kq.err" \
  && pass "text logs: a request's line" || fail "text logs: $(cat "$work/kq.err")"

# 6. Constrained decoding: the output matches the grammar or schema, engine and runtime alike.
printf 'root ::= " " ("cat" | "dog") " and the " [a-z]{3,8} "."\n' >"$work/g.gbnf"
for extra in "" "--mode colocated"; do
  out=$("$bin" generate --model "$model" --prompt "Once upon a time" -n 40 --temperature 1 --seed 5 --grammar "$work/g.gbnf" $extra 2>/dev/null)
  if [ -n "$extra" ]; then out=$(printf '%s\n' "$out" | grep -v '^--- request'); fi
  printf '%s' "$out" | grep -Eqx ' (cat|dog) and the [a-z]{3,8}\.' && pass "grammar ${extra:-engine}: '$out'"     || fail "grammar ${extra:-engine}: '$out'"
done
echo '{"type":"object","properties":{"n":{"type":"integer"},"ok":{"type":"boolean"}},"required":["n","ok"]}' >"$work/s.json"
out=$("$bin" generate --model "$model" --prompt "Once" -n 60 --temperature 1 --seed 3 --json-schema "$work/s.json" 2>/dev/null)
printf '%s' "$out" | python3 -c 'import json,sys; v=json.load(sys.stdin); assert list(v)==["n","ok"] and isinstance(v["n"],int) and isinstance(v["ok"],bool)' \
  && pass "json-schema: $out" || fail "json-schema: '$out'"
echo 'root ::= x' >"$work/bad.gbnf"
expect_error "the rule 'x' is not defined" generate --model "$model" --prompt x --grammar "$work/bad.gbnf"
echo '{"type":"string","pattern":"a"}' >"$work/bad.json"
expect_error "pattern" generate --model "$model" --prompt x --json-schema "$work/bad.json"

echo "$fails failure(s)"
[ "$fails" -eq 0 ]
