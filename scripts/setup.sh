#!/usr/bin/env bash
# Installs the Debian packages shardmm builds and tests with. Silent when they are all
# present, so that scripts/test.sh and scripts/demo.sh can call it every time. Arguments
# are further packages a script needs (scripts/fuzz.sh: clang and libFuzzer).
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache
  libopenblas-dev libcli11-dev libfmt-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin
  libscalapack-openmpi-dev
  python3-jsonschema
  python3-dev pybind11-dev python3-numpy  # import shardmm (python/)
  python3-pytest python3-hypothesis       # its tests (tests/python/)
  coinor-libcbc-dev pkg-config            # shardmm solve: CBC solves its integer programs
  libjemalloc-dev                         # the shardmm command's allocator (src/CMakeLists.txt)
  python3-torch  # bench_torch_matmul: the same sharded matmuls in torch.distributed (gloo); it skipped without
  "$@"
)

missing=()
for pkg in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
  [[ "$status" == installed ]] || missing+=("$pkg")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi

if ((EUID == 0)); then
  sudo=()
elif command -v sudo >/dev/null; then
  sudo=(sudo)
else
  echo "setup: missing packages (${missing[*]}) and not root, no sudo: install them and rerun" >&2
  exit 1
fi

echo "setup: installing ${missing[*]}" >&2
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
