#!/usr/bin/env bash
# End-to-end checks of `tandem model pull|list|rm` and `--model hf:REPO[:QUANT]` against a fake
# Hugging Face hub over HTTPS on loopback (tests/hub/fake_hub.py, its own CA made here): the file
# picked by quant, resumed and retried downloads, sha256 checks, the token and the proxy, the
# cache offline, and a clear error for each way it can fail.
#   test_model_pull.sh TANDEM_BINARY
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
pass() { echo "ok: $*"; }

for tool in openssl python3; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool is needed (tools/scripts/setup.sh --tests)"; echo "1 failure(s)"; exit 1; }
done
# Nothing from the caller's environment may send this test elsewhere.
unset HTTPS_PROXY https_proxy HTTP_PROXY http_proxy ALL_PROXY all_proxy NO_PROXY no_proxy
unset HF_TOKEN HUGGING_FACE_HUB_TOKEN HF_HUB_OFFLINE SSL_CERT_DIR
export TANDEM_CACHE_DIR=$work/cache
hubdir=$TANDEM_CACHE_DIR/hub

# A CA of our own and the hub's certificate for 127.0.0.1 and localhost (its "CDN").
(
  cd "$work" &&
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj "/CN=tandem test CA" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign &&
  openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=localhost" &&
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >ext.cnf &&
  openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 -extfile ext.cnf
) >"$work/openssl.log" 2>&1 || { echo "FAIL: openssl: $(cat "$work/openssl.log")"; echo "1 failure(s)"; exit 1; }
export SSL_CERT_FILE=$work/ca.pem

# The files the hub serves: real (tiny, synthetic) GGUFs, so that `generate` can run one.
m=$work/models
mkdir -p "$m"
synth() { "$bin" model synth --preset tiny --dtype "$1" --seed "$2" --out "$3" 2>>"$work/synth.log"; }
synth q8_0 42 "$m/tiny-Q8_0.gguf" && synth f16 42 "$m/tiny-F16.gguf" && synth q8_0 7 "$m/tiny-Q4_K_M.gguf" &&
  synth q8_0 8 "$m/tiny-Q4_K_S.gguf" || { echo "FAIL: model synth: $(cat "$work/synth.log")"; echo "1 failure(s)"; exit 1; }
size_of() { stat -c %s "$1"; }
q8=$m/tiny-Q8_0.gguf
f16=$m/tiny-F16.gguf
repo() {  # repo NAME FILE...: a folder of files the config names
  local d=$work/repos/$1; shift
  mkdir -p "$d"
  for f in "$@"; do cp "$f" "$d/"; done
}
repo multi "$q8" "$f16" "$m/tiny-Q4_K_M.gguf" "$m/tiny-Q4_K_S.gguf"
cp "$f16" "$work/repos/multi/mmproj-tiny-Q8_0.gguf"  # a vision projector: never picked
head -c 1000 "$f16" >"$work/repos/multi/tiny-Q6_K-00001-of-00002.gguf"
tail -c +1001 "$f16" >"$work/repos/multi/tiny-Q6_K-00002-of-00002.gguf"
echo "# tiny" >"$work/repos/multi/README.md"
repo one "$f16"
repo drop "$q8"
repo gated "$q8"
repo bad "$q8"
repo badetag "$q8"
repo resume "$f16"
repo norange "$f16"
repo limit "$f16"
repo proxy "$q8"
mkdir -p "$work/repos/nogguf" && echo "# weights elsewhere" >"$work/repos/nogguf/README.md" &&
  echo '{}' >"$work/repos/nogguf/config.json"
cat >"$work/hub.json" <<EOF
{"repos": {
  "test/tiny-GGUF": {"dir": "$work/repos/multi"},
  "test/one-GGUF": {"dir": "$work/repos/one"},
  "test/drop-GGUF": {"dir": "$work/repos/drop", "drop_first": true},
  "test/gated-GGUF": {"dir": "$work/repos/gated", "token": "hf_secret"},
  "test/bad-GGUF": {"dir": "$work/repos/bad", "bad_sha": true},
  "test/badetag-GGUF": {"dir": "$work/repos/badetag", "bad_etag": true},
  "test/resume-GGUF": {"dir": "$work/repos/resume"},
  "test/norange-GGUF": {"dir": "$work/repos/norange", "no_range": true},
  "test/limit-GGUF": {"dir": "$work/repos/limit"},
  "test/proxy-GGUF": {"dir": "$work/repos/proxy"},
  "test/nogguf": {"dir": "$work/repos/nogguf"}
}}
EOF

start() {  # start MODE PORTFILE ARGS...: runs fake_hub.py, waits for its port
  local portfile=$2
  python3 "$here/hub/fake_hub.py" "$1" --port-file "$portfile" "${@:3}" 2>>"$work/$1.log" &
  pids+=($!)
  for _ in $(seq 100); do [ -s "$portfile" ] && return 0; sleep 0.1; done
  echo "FAIL: fake_hub.py $1 did not start: $(cat "$work/$1.log")"; echo "1 failure(s)"; exit 1
}
start hub "$work/hub.port" --config "$work/hub.json" --cert "$work/server.pem" --key "$work/server.key" --stats "$work/stats.json"
hub_pid=${pids[-1]}
export HF_ENDPOINT=https://127.0.0.1:$(cat "$work/hub.port")

hubstat() {  # hubstat FILE_KEY FIELD, or hubstat TOPLEVEL_FIELD: a number from the hub's counters
  python3 - "$work/stats.json" "$@" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(d["files"].get(sys.argv[2], {}).get(sys.argv[3], 0) if len(sys.argv) > 3 else d[sys.argv[2]])
PY
}
pull() { "$bin" model pull "$@" >"$work/o" 2>"$work/e"; }
expect_error() {  # expect_error PATTERN ARGS...: exits non-zero, stderr names the problem
  local pat=$1; shift
  if "$bin" "$@" >"$work/o" 2>"$work/e"; then fail "'$*' succeeded"; return; fi
  grep -qi -- "$pat" "$work/e" && pass "'$*' -> $pat" || fail "'$*' error lacks '$pat': $(cat "$work/e")"
}
same() { cmp -s "$1" "$2"; }

# 1. A quant picks the file; stdout is the cached path, the bytes are the hub's, the record beside
# it holds the sha256.
dest=$hubdir/test--tiny-GGUF/tiny-Q8_0.gguf
if pull test/tiny-GGUF:q8_0 && [ "$(cat "$work/o")" = "$dest" ] && same "$dest" "$q8"; then pass "pull by quant: $dest"
else fail "pull test/tiny-GGUF:q8_0: $(cat "$work/o" "$work/e")"; fi
python3 - "$dest.json" "$(sha256sum "$q8" | cut -d' ' -f1)" "$(size_of "$q8")" <<'PY' && pass "record: repo, file, sha256, size, commit" || fail "record: $(cat "$dest.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["repo"] == "test/tiny-GGUF" and r["file"] == "tiny-Q8_0.gguf" and r["sha256"] == sys.argv[2], r
assert r["size"] == int(sys.argv[3]) and len(r["commit"]) == 40, r
PY
[ "$(hubstat cdn_auth)" = 0 ] && pass "no token, none sent" || fail "cdn got Authorization"
before=$(hubstat test/tiny-GGUF/tiny-Q8_0.gguf bytes)
pull test/tiny-GGUF:Q8_0 && grep -q "up to date" "$work/e" && [ "$(hubstat test/tiny-GGUF/tiny-Q8_0.gguf bytes)" = "$before" ] \
  && pass "a second pull downloads nothing" || fail "second pull: $(cat "$work/e")"
# No tag: Q4_K_M (llama.cpp's default); a repository with one GGUF: that one.
pull test/tiny-GGUF && same "$(cat "$work/o")" "$m/tiny-Q4_K_M.gguf" && pass "no tag: Q4_K_M" || fail "no tag: $(cat "$work/o" "$work/e")"
pull test/one-GGUF && same "$(cat "$work/o")" "$f16" && pass "no tag: the only GGUF" || fail "only GGUF: $(cat "$work/e")"

# 2. Wrong names: each a clear error listing what there is.
expect_error "matches several GGUF files.*tiny-Q4_K_M.gguf, tiny-Q4_K_S.gguf" model pull test/tiny-GGUF:Q4_K
expect_error "no GGUF file in repository 'test/tiny-GGUF' matches 'Q5_K_M' (choices: .*tiny-F16.gguf" model pull test/tiny-GGUF:Q5_K_M
grep -q mmproj "$work/e" && fail "mmproj listed as a choice: $(cat "$work/e")" || pass "mmproj is no choice"
expect_error "split into 2 files" model pull test/tiny-GGUF:Q6_K
expect_error "repository 'test/nope' not found on https://127.0.0.1" model pull test/nope:Q8_0
expect_error "has no GGUF file" model pull test/nogguf
expect_error "OWNER/NAME" model pull not-a-repo

# 3. The connection drops halfway through the file: retried from where it stopped (a Range
# request), so the hub sends about the file's bytes once in all.
size=$(size_of "$q8")
if pull test/drop-GGUF:Q8_0 && same "$(cat "$work/o")" "$q8"; then pass "pull through a dropped connection"
else fail "dropped connection: $(cat "$work/e")"; fi
k=test/drop-GGUF/tiny-Q8_0.gguf
# (Starting over would have cost half the file and the whole file again: 1.5 x its size.)
[ "$(hubstat $k range_requests)" -ge 1 ] && [ $((2 * $(hubstat $k bytes))) -lt $((3 * size)) ] && grep -qi "retrying" "$work/e" \
  && pass "resumed by Range: $(hubstat $k bytes) bytes served for $size" \
  || fail "drop: $(hubstat $k requests) requests, $(hubstat $k range_requests) ranged, $(hubstat $k bytes) bytes for $size"

# 4. A partial file from an earlier run: the next pull asks for the rest only (206, appended);
# a server that ignores Range (200) makes it start over.
size=$(size_of "$f16")
mkdir -p "$hubdir/test--resume-GGUF" "$hubdir/test--norange-GGUF"
head -c 100000 "$f16" >"$hubdir/test--resume-GGUF/tiny-F16.gguf.part"
head -c 100000 "$f16" >"$hubdir/test--norange-GGUF/tiny-F16.gguf.part"
k=test/resume-GGUF/tiny-F16.gguf
pull test/resume-GGUF:F16 && same "$(cat "$work/o")" "$f16" && [ "$(hubstat $k bytes)" -eq $((size - 100000)) ] \
  && [ "$(hubstat $k range_requests)" -eq 1 ] && [ ! -e "$hubdir/test--resume-GGUF/tiny-F16.gguf.part" ] \
  && pass "resume from a .part: $(hubstat $k bytes) of $size bytes fetched" || fail "resume: $(hubstat $k bytes) bytes; $(cat "$work/e")"
k=test/norange-GGUF/tiny-F16.gguf
pull test/norange-GGUF:F16 && same "$(cat "$work/o")" "$f16" && [ "$(hubstat $k bytes)" -eq "$size" ] \
  && pass "a 200 answer to a Range request restarts the file" || fail "no-range: $(hubstat $k bytes) bytes; $(cat "$work/e")"

# 5. A write failure (a file-size limit, as a full disk): a clear error, the partial file kept,
# and the next pull resumes it.
part=$hubdir/test--limit-GGUF/tiny-F16.gguf.part
if (ulimit -f 64; exec "$bin" model pull test/limit-GGUF:F16) >"$work/o" 2>"$work/e"; then fail "pull under ulimit -f succeeded"
else
  grep -q "cannot write.*File too large" "$work/e" && [ -s "$part" ] && [ "$(size_of "$part")" -le 65536 ] \
    && pass "write failure: $(grep -o 'File too large.*' "$work/e" | head -1)" || fail "write failure: $(cat "$work/e"); $(ls -l "$part")"
fi
k=test/limit-GGUF/tiny-F16.gguf
pull test/limit-GGUF:F16 && same "$(cat "$work/o")" "$f16" && [ "$(hubstat $k range_requests)" -eq 1 ] \
  && pass "after the write failure, the pull resumes" || fail "after write failure: $(cat "$work/e")"

# 6. Checksum mismatch: the bytes are kept aside as .bad, never used nor listed.
bad=$hubdir/test--bad-GGUF/tiny-Q8_0.gguf
expect_error "sha256 .* does not match the hub's" model pull test/bad-GGUF:Q8_0
grep -q "tiny-Q8_0.gguf.bad" "$work/e" && [ -f "$bad.bad" ] && [ ! -e "$bad" ] && [ ! -e "$bad.json" ] \
  && pass "mismatch kept aside as .bad" || fail "mismatch: $(ls "$hubdir/test--bad-GGUF")"
expect_error "does not match the hub's X-Linked-Etag" model pull test/badetag-GGUF:Q8_0
[ -f "$hubdir/test--badetag-GGUF/tiny-Q8_0.gguf.bad" ] && pass "X-Linked-Etag mismatch kept aside" || fail "etag mismatch: no .bad"
HF_HUB_OFFLINE=1 "$bin" generate --model hf:test/bad-GGUF:Q8_0 --prompt hi -n 2 >/dev/null 2>"$work/e" \
  && fail "a rejected file was used" || pass "a rejected file is not used offline"

# 7. A gated repository: the token opens it, goes to the hub's host and not to the CDN's.
expect_error "gated or private.*set HF_TOKEN" model pull test/gated-GGUF:Q8_0
HF_TOKEN=wrong expect_error "HF_TOKEN gives no access" model pull test/gated-GGUF:Q8_0
if HF_TOKEN=hf_secret "$bin" model pull test/gated-GGUF:Q8_0 >"$work/o" 2>"$work/e" && same "$(cat "$work/o")" "$q8"; then
  pass "HF_TOKEN opens the gated repository"
else fail "gated with token: $(cat "$work/e")"; fi
[ "$(hubstat cdn_auth)" = 0 ] && pass "the token is not sent to the redirect's host" || fail "token leaked to the CDN host"

# 8. Through an HTTPS proxy (CONNECT tunnels), unless NO_PROXY names the host.
start proxy "$work/proxy.port" --log "$work/tunnels.log"
proxy=http://127.0.0.1:$(cat "$work/proxy.port")
if HTTPS_PROXY=$proxy "$bin" model pull test/proxy-GGUF:Q8_0 >"$work/o" 2>"$work/e" && same "$(cat "$work/o")" "$q8"; then
  n=$(wc -l <"$work/tunnels.log")
  [ "$n" -ge 2 ] && grep -q "^localhost:" "$work/tunnels.log" && pass "through the proxy: $n tunnels" \
    || fail "proxy: tunnels $(cat "$work/tunnels.log")"
else fail "pull through the proxy: $(cat "$work/e")"; fi
"$bin" model rm test/proxy-GGUF >/dev/null 2>&1
n=$(wc -l <"$work/tunnels.log")
https_proxy=$proxy no_proxy=localhost,127.0.0.1 "$bin" model pull test/proxy-GGUF:Q8_0 >"$work/o" 2>"$work/e" \
  && [ "$(wc -l <"$work/tunnels.log")" -eq "$n" ] && pass "NO_PROXY: direct" || fail "no_proxy: $(cat "$work/e")"

# 9. A plain http:// endpoint (a local mirror) works too.
start hub "$work/plain.port" --plain --config "$work/hub.json" --stats "$work/plain-stats.json"
if HF_ENDPOINT=http://127.0.0.1:$(cat "$work/plain.port") TANDEM_CACHE_DIR=$work/plain-cache \
    "$bin" model pull test/one-GGUF >"$work/o" 2>"$work/e" && same "$(cat "$work/o")" "$f16"; then pass "http:// endpoint"
else fail "http:// endpoint: $(cat "$work/e")"; fi

# 10. The cache: model list, --model hf: offline, model rm.
"$bin" model list >"$work/list" 2>"$work/e"
grep -q "^test/tiny-GGUF .*tiny-Q8_0.gguf .*MiB  $dest$" "$work/list" && ! grep -q bad-GGUF "$work/list" \
  && pass "model list" || fail "model list: $(cat "$work/list" "$work/e")"
"$bin" model list --json | python3 -c 'import json,sys; a=json.load(sys.stdin); assert {"repo","file","size","path","sha256"} <= set(a[0]), a' \
  && pass "model list --json" || fail "model list --json"
requests=$(hubstat requests)
HF_HUB_OFFLINE=1 "$bin" generate --model hf:test/tiny-GGUF:Q8_0 --prompt hi -n 2 >"$work/o" 2>"$work/e" \
  && [ "$(hubstat requests)" = "$requests" ] && pass "HF_HUB_OFFLINE=1: generate from the cache" || fail "offline generate: $(cat "$work/e")"
"$bin" generate --model hf:test/tiny-GGUF:Q8_0 --prompt hi -n 2 >"$work/o" 2>"$work/e" \
  && [ "$(hubstat requests)" = "$requests" ] && pass "--model hf: uses the cache without the hub" || fail "cached generate: $(cat "$work/e")"
HF_HUB_OFFLINE=1 expect_error "HF_HUB_OFFLINE is set and 'test/tiny-GGUF:F16' is not in the cache" model pull test/tiny-GGUF:F16
HF_HUB_OFFLINE=1 expect_error "HF_HUB_OFFLINE is set and hf:test/nope is not in the cache" generate --model hf:test/nope --prompt hi
[ "$(hubstat requests)" = "$requests" ] && pass "offline: no request reached the hub" || fail "offline contacted the hub"
# The hub gone: --model hf: from the cache, pull warns and uses the cache, a missing file fails.
kill "$hub_pid"; wait "$hub_pid" 2>/dev/null
"$bin" generate --model hf:test/tiny-GGUF:Q8_0 --prompt hi -n 2 >"$work/o" 2>"$work/e" \
  && pass "hub stopped: generate --model hf: from the cache" || fail "hub stopped, generate: $(cat "$work/e")"
pull test/tiny-GGUF:Q8_0 && [ "$(cat "$work/o")" = "$dest" ] && grep -q "cannot reach the hub" "$work/e" \
  && pass "hub stopped: pull warns and uses the cache" || fail "hub stopped, pull: $(cat "$work/o" "$work/e")"
expect_error "cannot reach the hub at https://127.0.0.1" model pull test/tiny-GGUF:F16
# rm: one quant, then a whole repository (its partial and rejected files too).
"$bin" model rm test/tiny-GGUF:Q8_0 2>"$work/e" && [ ! -e "$dest" ] && [ ! -e "$dest.json" ] \
  && "$bin" model list | grep -q "^test/tiny-GGUF .*tiny-Q4_K_M.gguf" && ! "$bin" model list | grep -q "^test/tiny-GGUF .*tiny-Q8_0.gguf" \
  && pass "model rm REPO:QUANT" || fail "rm quant: $(cat "$work/e")"
"$bin" model rm test/bad-GGUF 2>"$work/e" && [ ! -e "$hubdir/test--bad-GGUF" ] && pass "model rm REPO" || fail "rm repo: $(cat "$work/e")"
expect_error "no GGUF file in the cache of 'test/tiny-GGUF' matches 'Q8_0'" model rm test/tiny-GGUF:Q8_0

echo "$fails failure(s)"
[ "$fails" -eq 0 ]
