# Sourced by the build scripts before they configure a build directory: compiles through
# ccache (installed by setup.sh) so that a clean clone, CI's among them, rebuilds only what
# changed since any earlier build on this machine; a cold cache costs a few percent.
# base_dir makes the clone's absolute paths relative in what ccache hashes (and in what it
# passes on: __FILE__ and the -I paths), and no_hash_dir leaves the working directory out
# of the hash of -g builds, so clones in different directories share entries.
# SHARDMM_CCACHE=0 turns it off. A build directory keeps the launcher it was first
# configured with (CMake reads these variables only then).
if [[ "${SHARDMM_CCACHE:-1}" != 0 ]] && command -v ccache >/dev/null; then
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
  CCACHE_BASEDIR=$(pwd -P)
  export CCACHE_BASEDIR CCACHE_NOHASHDIR=1
fi
