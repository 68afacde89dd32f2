#!/usr/bin/env bash
# ctest e2e_clients: installs the npm clients (package-lock.json pins them) and runs e2e.mjs.
# Needs node + npm, Debian's chromium and prometheus (promtool): tools/scripts/setup.sh --tests
# installs them. Missing tools fail the test loudly; nothing is skipped.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
for tool in node npm chromium promtool; do
  command -v "$tool" >/dev/null || { echo "e2e: '$tool' not found: run tools/scripts/setup.sh --tests" >&2; exit 1; }
done
[ $# -eq 2 ] || { echo "usage: run.sh TANDEM_BINARY MODEL.gguf" >&2; exit 2; }
tandem="$(realpath "$1")"; model="$(realpath "$2")"
cd "$here"
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
exec node e2e.mjs "$tandem" "$model"
