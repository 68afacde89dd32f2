#!/usr/bin/env bash
# Installs everything tandem builds with, from Debian 12 packages. Idempotent; run as root.
# --tests also installs what the end-to-end tests drive tandem with: Node.js + npm (for the npm
# clients openai, ws, playwright-core), Chromium (headless browser), Prometheus (promtool), and
# openssl + python3 (a fake Hugging Face hub over HTTPS).
set -euo pipefail
pkgs=(build-essential cmake ninja-build ccache pkg-config
      libcaf-dev libboost-dev libmsgpack-cxx-dev nlohmann-json3-dev
      libcli11-dev libspdlog-dev libfmt-dev libxxhash-dev libpcre2-dev libopenblas-dev libssl-dev
      googletest libgtest-dev libgmock-dev libbenchmark-dev)
if [ "${1:-}" = "--tests" ]; then
  pkgs+=(chromium prometheus ca-certificates iproute2)  # iproute2: the cluster test's network namespaces
  pkgs+=(openssl python3)  # test_model_pull.sh: its own CA and certificate, the fake hub
  pkgs+=(dpkg-dev file)  # test_install.sh: cpack -G DEB (dpkg-shlibdeps, file)
  pkgs+=(doxygen clang-format)  # the API reference (ctest api_reference), the format check (ctest format)
  # A machine may bring its own Node.js; otherwise Debian's.
  command -v node >/dev/null && command -v npm >/dev/null || pkgs+=(nodejs npm)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all packages present"; exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "setup: missing packages (${missing[*]}); run this script as root" >&2; exit 1
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
