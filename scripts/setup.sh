#!/usr/bin/env bash
# Installs Trellis's build and test dependencies from Debian 12 packages (run as root,
# or with sudo available). Idempotent: skips apt entirely when everything is present.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache g++ clang libclang-rt-14-dev python3
  libgtest-dev libgmock-dev libbenchmark-dev
  libfmt-dev libcli11-dev nlohmann-json3-dev gnuplot-nox
  libcpp-httplib-dev nodejs curl tmux
  libboost-dev zlib1g-dev libbrotli-dev brotli
  libucx-dev ucx-utils libxxhash-dev pkg-config
  pybind11-dev python3-pybind11 python3-dev python3-numpy python3-pytest etcd-server
  json-schema-test-suite python3-jsonschema libicu-dev
  libjs-marked chromium
)

# The aarch64 cross build (scripts/build.sh aarch64, run under qemu-user by the test
# command): Debian's cross compiler, qemu-user and the arm64 builds of the libraries the
# core links, from Debian's multiarch archive.
CROSS_ARM64=()
if [[ $(uname -m) == x86_64 ]]; then
  PACKAGES+=(g++-aarch64-linux-gnu qemu-user-static)
  CROSS_ARM64=(libgtest-dev:arm64 libfmt-dev:arm64 libxxhash-dev:arm64)
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
# (A new foreign architecture leaves its packages missing below, so apt-get update runs.)
if ((${#CROSS_ARM64[@]})) && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  $SUDO dpkg --add-architecture arm64
fi

missing=()
for p in "${PACKAGES[@]}" "${CROSS_ARM64[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Debian's nodejs comes without npm (a separate package); NodeSource's bundles it and
# conflicts with Debian's npm, so ask for npm only when there is none.
command -v npm >/dev/null 2>&1 || missing+=(npm)
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
