#!/usr/bin/env bash
# Quick start (1): install dependencies, build, and run tandem's main job on the built-in
# default model. Extra arguments go to `tandem generate`.
set -euo pipefail
cd "$(dirname "$0")/../.."
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
as_root tools/scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target tandem
if [ $# -eq 0 ]; then
  set -- --prompt "Once upon a time" -n 64
fi
exec build/tools/tandem generate "$@"
