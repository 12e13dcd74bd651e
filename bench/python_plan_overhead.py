#!/usr/bin/env python3
"""What `import shardmm` adds to a plan, and what `run` copies.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_plan_overhead.py [--calls 2000]

1. plan: the median time of shardmm.plan(...) called from Python, against the median of the
   same call made in C++ alone (the module's _plan_seconds loops over it with no Python in
   between), for a small and a large mesh. The ratio is Python's overhead: argument
   conversion, the call, the returned document (parsed only when an attribute is read).
2. run: Python-side allocations of shardmm.run on arrays of the right dtype and layout
   (tracemalloc counts numpy's), against the arrays' size: only the result is allocated;
   the ranks' blocks (the scatter) are allocated in C++, one block per device.
3. run, the whole process: the peak resident memory a run adds (Linux's VmHWM, reset through
   /proc/self/clear_refs), against the bytes the ranks' blocks of A and B take (the scatter)
   and the result: a copy of the global array beyond the scatter would add its size again.
"""
import argparse
import statistics
import time
import tracemalloc
from pathlib import Path

import numpy as np

import shardmm
from shardmm import _shardmm

CASES = [
    ("A[I, J_X] @ B[J_X, K] -> C[I, K]", "X=4", "I=8192,J=4096,K=16384"),
    ("A[I_X, J_Y] @ B[J_Y, K_Z] -> C[I_X, K_Z]", "X=16,Y=16,Z=8", "I=65536,J=8192,K=65536"),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000, help="calls timed on each side (default 2000)")
    args = parser.parse_args()
    print("plan: median per call, C++ alone vs from Python")
    for expr, mesh, dims in CASES:
        _shardmm._plan_seconds(expr, mesh, dims, 50)  # warm up
        # The two sides alternate in rounds of 50 calls, so that a change in the machine's
        # load meanwhile falls on both.
        cpp, py = [], []
        for _ in range(max(1, args.calls // 50)):
            cpp += _shardmm._plan_seconds(expr, mesh, dims, 50)
            for _ in range(50):
                start = time.perf_counter()
                shardmm.plan(expr, mesh, dims)
                py.append(time.perf_counter() - start)
        cpp, py = statistics.median(cpp), statistics.median(py)
        print(f"  {expr} on {mesh}: C++ {cpp * 1e6:.1f} us, Python {py * 1e6:.1f} us, "
              f"overhead {(py - cpp) * 1e6:.1f} us = {(py / cpp - 1) * 100:.1f}%")

    n = 2048
    a, b = np.ones((n, n)), np.ones((n, n))
    for verify in (False, True):
        shardmm.run("A[I, J_X] @ B[J_X, K] -> C[I, K]", "X=4", a=a, b=b, verify=verify)
        tracemalloc.start()
        shardmm.run("A[I, J_X] @ B[J_X, K] -> C[I, K]", "X=4", a=a, b=b, verify=verify)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        print(f"run {n}x{n} f64 (verify={verify}): Python-side peak allocation {peak / 2**20:.1f} MiB; "
              f"each array {a.nbytes / 2**20:.1f} MiB, the result {n * n * 8 / 2**20:.1f} MiB")
    f = np.asfortranarray(a)
    tracemalloc.start()
    shardmm.run("A[I, J_X] @ B[J_X, K] -> C[I, K]", "X=4", a=f, b=b, verify=False)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"run with a Fortran-ordered a: Python-side peak {peak / 2**20:.1f} MiB (a is copied to C order once)")
    whole_process()


def status_kib(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def peak_added_by(fn):
    """Bytes of resident memory fn() adds at its peak (0 where the kernel cannot reset the peak)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    except OSError:
        return 0
    before = status_kib("VmRSS")
    fn()
    return (status_kib("VmHWM") - before) * 1024


def whole_process():
    # A tall A split over X, a thin replicated B: the scatter is A's size (each rank its rows)
    # plus B once per rank; the result is small; the GEMMs are cheap.
    print("run, the whole process: peak resident memory a run adds")
    expr, mesh, k = "A[I_X, J] @ B[J, K] -> C[I_X, K]", "X=2", 8
    for mib in (256, 512, 1024):
        n = int((mib * 2**20 / 8) ** 0.5)
        a, b = np.ones((n, n)), np.ones((n, k))
        shardmm.run(expr, mesh, a=np.ones((64, 64)), b=np.ones((64, k)), verify=False)  # threads, BLAS warm
        added = peak_added_by(lambda: shardmm.run(expr, mesh, a=a, b=b, verify=False))
        scatter = a.nbytes + 2 * b.nbytes
        result = n * k * 8
        print(f"  A {n}x{n} f64 ({a.nbytes / 2**20:.0f} MiB): added {added / 2**20:.0f} MiB; the scatter "
              f"{scatter / 2**20:.0f} MiB and the result {result / 2**20:.1f} MiB: "
              f"{added / (scatter + result):.2f}x what a run must hold")


if __name__ == "__main__":
    main()
