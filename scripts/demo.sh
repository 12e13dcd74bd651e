#!/usr/bin/env bash
# Builds the shardmm command and runs its demo: the Scaling Book's four sharded-matmul cases,
# planned and explained. Extra arguments are passed on to `shardmm demo`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
source scripts/compiler-cache.sh
echo "demo: configuring build/" >&2
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
echo "demo: building the shardmm command" >&2
cmake --build build -j"$(nproc)" --target shardmm_cli
echo "demo: running build/src/shardmm demo" >&2
build/src/shardmm demo "$@"
