#!/usr/bin/env bash
# Builds everything in ./build (Release, Ninja) and runs the whole test suite.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
source scripts/compiler-cache.sh
echo "test: configuring build/" >&2
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
echo "test: building all targets" >&2
cmake --build build -j"$(nproc)"
echo "test: running ctest" >&2
ctest --test-dir build --output-on-failure -j2
