// jemalloc's options for the shardmm command, read by jemalloc at its start (the environment's
// MALLOC_CONF, read after, still overrides them). Compiled only where the command links jemalloc.
//
// Huge pages for the heap and jemalloc's own metadata: solve's recordings grow the heap to a few
// hundred MB in small blocks, and with 4 KiB pages a sixth of its time went to page faults
// (docs/benchmarks.md, "Solve time").
// (In a linkage block: `extern "C" const char* malloc_conf = ...` draws a warning from GCC.)
extern "C" {
const char* malloc_conf = "thp:always,metadata_thp:always";
}
