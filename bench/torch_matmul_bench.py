#!/usr/bin/env python3
"""PyTorch (torch.distributed, gloo on 127.0.0.1) against shardmm's mpi backend, one run.

    bench/torch_matmul_bench.py --shardmm build/src/shardmm [--ranks 2] [--sizes 512,1024]
                                [--repeat 7] [--warmup 1] [--rounds 3] [--dtype f32] [--hw h100] [--json]

Both sides compute A[I_X, J] @ B[J_X, K] -> C[I_X, K] on X = --ranks processes, every dimension
N, each process with one BLAS thread: each rank starts with its row block of A and of B and ends
with its row block of C. shardmm runs the planner's chosen plan under mpirun (`shardmm bench
matmul --backend mpi --json`); PyTorch runs the plan shardmm chose, "all_gather B over X, then
local einsum", with the same collective: dist.all_gather of the B blocks straight into the rows
of one preallocated B (no copy after it), then torch.matmul into the C block. Each side is timed
barrier to barrier after --warmup untimed runs. The two sides alternate for --rounds rounds
(shardmm, torch, shardmm, ...), so a change in the machine's load falls on both: per round the
medians of --repeat give ours/torch = torch time / shardmm time (>= 1: shardmm is not slower);
the median of the rounds' ratios is reported, with each side's median time over the rounds and
how much of torch's went into dist.all_gather (rank 0's, from the barrier to its return).

PyTorch's result is verified on every rank against an f64 reference built independently from
the same seeds: ||C x - A (B x)|| for a random x (Freivalds' check, O(N^2)), against a bound of
a few units of roundoff per term. shardmm verifies its own against the dense reference.
Exit status: 0 done, 1 a result is wrong, 2 bad input, 77 torch is not importable (skipped).
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

SKIPPED = 77
EXPR = "A[I_X, J] @ B[J_X, K] -> C[I_X, K]"
TORCH_PLAN = "all_gather B over X, then local einsum"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shardmm", required=True, help="the shardmm command, e.g. build/src/shardmm")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--sizes", default="512,1024,2048,4096")
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dtype", choices=["f32", "f64"], default="f32")
    p.add_argument("--hw", default="h100", help="shardmm's planning profile")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    try:
        a.sizes = [int(s) for s in a.sizes.split(",")]
    except ValueError:
        p.error(f"bad --sizes '{a.sizes}': write whole numbers separated by commas, e.g. 512,1024")
    if a.ranks < 1 or a.repeat < 1 or a.rounds < 1 or a.warmup < 0 or any(n < 1 or n % a.ranks for n in a.sizes):
        p.error("--ranks, --repeat and --rounds >= 1, --warmup >= 0, every size a positive multiple of --ranks")
    return a


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_rank(rank, args, port, results):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.ranks)
    dtype = torch.float32 if args.dtype == "f32" else torch.float64
    out = []
    for n in args.sizes:
        rows = n // args.ranks
        mine = slice(rank * rows, (rank + 1) * rows)
        # The whole A and B from fixed seeds on every rank: each keeps its block; the reference uses them all.
        a_full = torch.rand(n, n, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 2 - 1
        b_full = torch.rand(n, n, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 2 - 1
        a = a_full[mine].to(dtype).contiguous()
        b = b_full[mine].to(dtype).contiguous()
        gathered = torch.empty(n, n, dtype=dtype)
        blocks = list(gathered.chunk(args.ranks))  # contiguous row blocks: gloo writes into them
        c = torch.empty(rows, n, dtype=dtype)
        times, gathers = [], []
        for r in range(args.warmup + args.repeat):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_gather(blocks, b)
            t1 = time.perf_counter()
            torch.matmul(a, gathered, out=c)
            dist.barrier()
            if r >= args.warmup:
                times.append(time.perf_counter() - t0)
                gathers.append(t1 - t0)
        # Freivalds' check against the f64 inputs, rounded as the ranks saw them.
        x = torch.rand(n, 1, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        a64 = a_full[mine].to(dtype).to(torch.float64)
        b64 = b_full.to(dtype).to(torch.float64)
        error = (c.to(torch.float64) @ x - a64 @ (b64 @ x)).abs().max().item()
        bound = (a64.abs() @ (b64.abs() @ x.abs())).max().item()
        eps = torch.finfo(dtype).eps
        ok = error <= 4 * n * eps * bound
        verdict = torch.tensor([1 if ok else 0])
        dist.all_reduce(verdict, op=dist.ReduceOp.MIN)
        out.append({"n": n, "time_s": statistics.median(times), "all_gather_s": statistics.median(gathers),
                    "verified": bool(verdict.item()), "relative_error": error / bound})
    if rank == 0:
        results.put(out)
    dist.destroy_process_group()


def run_torch(args):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=torch_rank, args=(r, args, port, results)) for r in range(args.ranks)]
    for p in procs:
        p.start()
    out = results.get()
    for p in procs:
        p.join()
    if any(p.exitcode != 0 for p in procs):
        sys.exit("torch_matmul_bench: a PyTorch rank failed")
    return out


def run_shardmm(args):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMPI_MCA_btl="self,vader", OMPI_MCA_pml="ob1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none")
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-n", str(args.ranks), args.shardmm, "bench", "matmul",
           EXPR, "--mesh", f"X={args.ranks}", "--backend", "mpi", "--sizes", ",".join(map(str, args.sizes)),
           "--repeat", str(args.repeat), "--warmup", str(args.warmup), "--dtype", args.dtype, "--hw", args.hw, "--json"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        sys.exit(f"torch_matmul_bench: shardmm exited {done.returncode}")
    return json.loads(done.stdout)


def main():
    args = parse_args()
    try:
        import torch  # noqa: F401
        import torch.distributed as dist
    except ImportError as e:
        print(f"torch_matmul_bench: skipped: PyTorch is not importable by {sys.executable} ({e}); on Debian "
              "install python3-torch and run this with /usr/bin/python3", file=sys.stderr)
        return SKIPPED
    if not dist.is_available() or not dist.is_gloo_available():
        print("torch_matmul_bench: skipped: this PyTorch has no torch.distributed with gloo", file=sys.stderr)
        return SKIPPED
    rounds = []
    for r in range(args.rounds):
        print(f"torch_matmul_bench: round {r + 1} of {args.rounds}: shardmm, then torch", file=sys.stderr)
        rounds.append((run_shardmm(args), run_torch(args)))
    rows = []
    for i, n in enumerate(args.sizes):
        ours = [o["points"][i]["runs"][0] for o, _ in rounds]
        theirs = [t[i] for _, t in rounds]
        flops = rounds[0][0]["points"][i]["flops"]
        ours_s = statistics.median(o["measured_time_s"] for o in ours)
        torch_s = statistics.median(t["time_s"] for t in theirs)
        ratios = [t["time_s"] / o["measured_time_s"] for o, t in zip(ours, theirs)]
        rows.append({"n": n, "shardmm_plan": ours[0]["description"], "same_plan": ours[0]["description"] == TORCH_PLAN,
                     "shardmm_time_s": ours_s, "torch_time_s": torch_s,
                     "torch_all_gather_s": statistics.median(t["all_gather_s"] for t in theirs),
                     "shardmm_flop_rate": flops / ours_s, "torch_flop_rate": flops / torch_s,
                     "ours_over_torch": statistics.median(ratios), "ours_over_torch_per_round": ratios,
                     "shardmm_verified": all(o["verified"] for o in ours),
                     "torch_verified": all(t["verified"] for t in theirs),
                     "torch_relative_error": max(t["relative_error"] for t in theirs)})
    if args.json:
        print(json.dumps({"expression": EXPR, "ranks": args.ranks, "dtype": args.dtype, "repeat": args.repeat,
                          "warmup": args.warmup, "rounds": args.rounds, "torch_version": torch.__version__, "torch_plan": TORCH_PLAN,
                          "points": rows}, indent=2))
    else:
        print(f"{EXPR} on {args.ranks} processes, {args.dtype}, 1 BLAS thread per rank, median of {args.repeat}, "
              f"{args.rounds} alternating rounds; "
              f"shardmm mpi backend vs PyTorch {torch.__version__} gloo ({TORCH_PLAN})")
        print(f"{'N':>6} {'shardmm (s)':>12} {'torch (s)':>12} {'gloo gather':>12} {'shardmm GF/s':>13} "
              f"{'torch GF/s':>11} {'ours/torch':>11} {'verified':>9}  shardmm plan")
        for r in rows:
            verified = "both" if r["shardmm_verified"] and r["torch_verified"] else "NO"
            print(f"{r['n']:>6} {r['shardmm_time_s']:>12.6f} {r['torch_time_s']:>12.6f} {r['torch_all_gather_s']:>12.6f} "
                  f"{r['shardmm_flop_rate'] / 1e9:>13.2f} {r['torch_flop_rate'] / 1e9:>11.2f} "
                  f"{r['ours_over_torch']:>11.3f} {verified:>9}  {r['shardmm_plan']}")
        print("(gloo gather: rank 0's time in dist.all_gather, the rest of torch's time is torch.matmul and the "
              "closing barrier)")
    wrong = [r["n"] for r in rows if not (r["shardmm_verified"] and r["torch_verified"])]
    if wrong:
        print(f"torch_matmul_bench: wrong result at N = {wrong}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
