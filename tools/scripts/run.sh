#!/usr/bin/env bash
# Quick start (1): install dependencies, build, and run tandem's main job, `tandem serve`, on
# the built-in default model (http://127.0.0.1:8080). Extra arguments go to `tandem serve`.
set -euo pipefail
cd "$(dirname "$0")/../.."
# Ninja keeps both cores busy to the end (make waits for a library before its dependants' files);
# it applies to a new build folder only.
export CMAKE_GENERATOR=${CMAKE_GENERATOR:-Ninja}
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
as_root tools/scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target tandem
exec build/tools/tandem serve "$@"
