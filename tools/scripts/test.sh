#!/usr/bin/env bash
# Quick start (2): install dependencies, build, and run every test: the Release suite, then
# the same suite under AddressSanitizer + UndefinedBehaviorSanitizer.
# Set TANDEM_SKIP_SANITIZERS=1 to run only the Release suite (a local shortcut; CI runs both).
set -euo pipefail
cd "$(dirname "$0")/../.."
# Ninja keeps both cores busy to the end (make waits for a library before its dependants' files);
# it applies to a new build folder only.
export CMAKE_GENERATOR=${CMAKE_GENERATOR:-Ninja}
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
as_root tools/scripts/setup.sh --tests
jobs=$(nproc)

echo "== Release build and tests"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs" --timeout 900

if [ "${TANDEM_SKIP_SANITIZERS:-0}" != "1" ]; then
  echo "== ASan + UBSan build and tests"
  # -g1: line tables for the sanitizers' stack traces without full debug info, which is most of
  # this build's time on 2 cores.
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
    -DTANDEM_SANITIZE=ON -DTANDEM_CUDA=OFF >/dev/null
  cmake --build build-asan -j"$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs" --timeout 1800
fi
echo "== all tests passed"
