#!/usr/bin/env bash
# The C++ files' format: .clang-format's (Debian 12's clang-format 14) and no line over 120
# columns. Run by ctest as `format`; `--fix` rewrites the files instead of failing.
#   check_format.sh [--fix] [ROOT]
set -euo pipefail
fix=0
if [ "${1:-}" = "--fix" ]; then fix=1; shift; fi
cd "${1:-$(dirname "$0")/../..}"
command -v clang-format >/dev/null || { echo "check_format: clang-format is needed (tools/scripts/setup.sh --tests)"; exit 1; }
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
else
  mapfile -t files < <(find . -path ./build -prune -o -path './build-*' -prune -o \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print)
fi
if [ "$fix" = 1 ]; then
  clang-format -i "${files[@]}"
else
  clang-format --dry-run --Werror "${files[@]}"
fi
# clang-format leaves what it cannot break (a raw string's line, a long literal without
# spaces) over the limit; those are split by hand (adjacent literals keep the same bytes).
python3 - "${files[@]}" <<'PY'
import sys
long = [f"{f}:{n}: {len(l)} columns" for f in sys.argv[1:]
        for n, l in enumerate(open(f, encoding="utf-8").read().split("\n"), 1) if len(l) > 120]
print("\n".join(long[:50]))
if long:
    sys.exit(f"check_format: {len(long)} lines over 120 columns")
PY
echo "check_format: ${#files[@]} files formatted, no line over 120 columns"
