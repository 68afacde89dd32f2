#!/usr/bin/env bash
# tandem as a library, from outside its tree: `cmake --install` into a clean prefix installs
# the public headers and no private one; `cpack -G DEB` makes a package that declares its
# Debian dependencies; and a program of its own (examples/consumer) is configured with nothing
# but find_package(tandem 0.2), built against the package's files, and run: it composes a
# pipeline, serves a request, kills a worker and gets the same answers.
#   test_install.sh BUILD_DIR SOURCE_DIR [EXTRA_CXX_FLAGS]
set -uo pipefail
build=$1
src=$2
flags=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
pass() { echo "ok: $*"; }
version=$(sed -n 's/^#define TANDEM_VERSION "\(.*\)"/\1/p' "$build/generated/tandem/version.h")

# 1. cmake --install: the public API's headers, the CMake package, the archives, the binary.
if cmake --install "$build" --prefix "$work/prefix" >"$work/install.log" 2>&1; then
  pass "cmake --install into a clean prefix"
else
  fail "cmake --install"; cat "$work/install.log"
fi
inc=$work/prefix/include/tandem
for h in tandem.h version.h actors/pipeline.h runtime/serving_config.h runtime/scheduler/policy.h \
         runtime/fault_injection.h runtime/errors.h actors/error.h runtime/engine/engine.h; do
  [ -f "$inc/$h" ] || fail "public header $h not installed"
done
for h in actors/router.h actors/decode_worker.h actors/worker_common.h tools/server/http_server.h \
         runtime/text/jinja_internal.h runtime/tokenizer/tokenizer_internal.h; do
  [ -e "$inc/$h" ] && fail "private header $h installed"
done
[ -f "$work/prefix/lib/cmake/tandem/tandemConfig.cmake" ] || fail "tandemConfig.cmake not installed"
[ -f "$work/prefix/lib/libtandem_actors.a" ] || fail "libtandem_actors.a not installed"
out=$("$work/prefix/bin/tandem" --version 2>&1)
[ "$out" = "tandem $version" ] && pass "installed tandem --version: $out" || fail "tandem --version said '$out'"

# 2. cpack -G DEB: a package whose control file names its dependencies.
if (cd "$build" && cpack -G DEB -B "$work/pkg") >"$work/cpack.log" 2>&1; then
  deb=$(ls "$work"/pkg/tandem_*.deb 2>/dev/null | head -1)
  [ -n "$deb" ] && pass "cpack -G DEB made $(basename "$deb") ($(du -k "$deb" | cut -f1) KiB)" || fail "no .deb made"
else
  fail "cpack -G DEB"; tail -30 "$work/cpack.log"; deb=""
fi
if [ -n "$deb" ]; then
  info=$(dpkg-deb -f "$deb" Package Version Depends)
  grep -q "^Version: $version" <<<"$info" || fail "package version: $info"
  for dep in libcaf-dev libspdlog-dev libfmt-dev libopenblas-dev libxxhash-dev; do
    grep -q "$dep" <<<"$info" || fail "package does not depend on $dep"
  done
  dpkg-deb -x "$deb" "$work/root"
  [ -f "$work/root/usr/include/tandem/tandem.h" ] && [ -x "$work/root/usr/bin/tandem" ] &&
    [ -f "$work/root/usr/lib/cmake/tandem/tandemConfig.cmake" ] && pass "package holds the binary, headers and CMake package" ||
    fail "package contents: $(dpkg-deb -c "$deb" | head -20)"
fi

# 3. An outside program against the package's files, found by find_package alone.
root=$work/root/usr
[ -n "$deb" ] || root=$work/prefix
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
start=$(date +%s)
if cmake -S "$src/examples/consumer" -B "$work/consumer" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
     -DCMAKE_PREFIX_PATH="$root" -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" >"$work/consumer.log" 2>&1 &&
   cmake --build "$work/consumer" >>"$work/consumer.log" 2>&1; then
  pass "consumer configured with find_package(tandem 0.2) and built in $(( $(date +%s) - start )) s"
else
  fail "consumer build"; tail -40 "$work/consumer.log"
fi
if [ -x "$work/consumer/consumer" ]; then
  if TANDEM_CACHE_DIR=$work/cache "$work/consumer/consumer" >"$work/run.log" 2>&1 &&
     grep -q "same answer" "$work/run.log" && grep -q "^tandem $version (headers $version)" "$work/run.log"; then
    pass "consumer served, killed a worker, same answers: $(grep -c . "$work/run.log") lines"
  else
    fail "consumer run"; cat "$work/run.log"
  fi
fi
# The version check rejects another minor version (SameMinorVersion: 0.x changes the API).
mkdir -p "$work/old"
cat >"$work/old/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(wants_old LANGUAGES CXX)
find_package(tandem 0.1 CONFIG REQUIRED)
CMAKE
if cmake -S "$work/old" -B "$work/old/build" -DCMAKE_PREFIX_PATH="$root" >"$work/old.log" 2>&1; then
  fail "find_package(tandem 0.1) accepted $version"
else
  grep -q "version" "$work/old.log" && pass "find_package(tandem 0.1) refused: not compatible with $version" ||
    fail "find_package(tandem 0.1) failed for another reason: $(tail -5 "$work/old.log")"
fi

echo "$fails failure(s)"
[ "$fails" -eq 0 ]
