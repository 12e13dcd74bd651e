#!/usr/bin/env python3
"""Tables and plot data from the JSON that scripts/bench-peers.sh collects (stdlib only).

    scripts/peers_report.py DIR     # reads DIR/*.json, writes DIR/tables.md and DIR/*.dat

Each table is a ratio against a reference measured in the same run (docs/benchmarks.md).
"""
import glob
import json
import math
import os
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def gflops(rate):
    return f"{rate / 1e9:.2f}"


def dims_text(dims):
    return ", ".join(f"{k}={v}" for k, v in dims.items())


def gemm_table(doc):
    """Item 1: the chosen plan against one GEMM of the same FLOPs."""
    lines = [f"`{doc['expression']}`, mesh {dims_text(doc['mesh'])}, {doc['backend']} backend, {doc['dtype']}, "
             f"GEMM with {doc['gemm_threads']} threads, median of {doc['repeat']}, predictions on {doc['hw']}",
             "",
             "| dims | plan | GEMM GFLOP/s | ours GFLOP/s | ours / GEMM | model comm/compute | verified |",
             "|---|---|---|---|---|---|---|"]
    for p in doc["points"]:
        r = p["runs"][0]
        ratio = r["predicted_comm_s"] / r["predicted_compute_s"] if r["predicted_compute_s"] else 0
        lines.append(f"| {dims_text(p['dims'])} | {r['description']} | {gflops(p['gemm']['flop_rate'])} | "
                     f"{gflops(r['flop_rate'])} | {r['vs_gemm']:.3f} | {ratio:.3f} | "
                     f"{'yes' if r['verified'] else 'NO'} |")
    return lines


def choice_rows(docs):
    """Item 4: per point, the chosen plan's time over the fastest measured candidate; where that
    was another, also over it in the runoff of the two, on which the point is judged."""
    lines = ["| expression | mesh | dims | candidates | chosen | fastest | chosen / fastest | runoff | within 5% |",
             "|---|---|---|---|---|---|---|---|---|"]
    within = total = 0
    for doc in docs:
        for p in doc["points"]:
            runs = {r["candidate"]: r for r in p["runs"]}
            chosen, fastest = runs[p["chosen"]], runs[p["fastest"]]
            ratio = chosen["measured_time_s"] / fastest["measured_time_s"]
            runoff = f"{p['runoff']['chosen_over_candidate']:.3f}" if "runoff" in p else "-"
            total += 1
            within += p["chosen_within_5pct"]
            lines.append(f"| `{doc['expression']}` | {dims_text(doc['mesh'])} | {dims_text(p['dims'])} | "
                         f"{len(p['runs'])} | {p['chosen'] + 1} | {p['fastest'] + 1} | {ratio:.3f} | {runoff} | "
                         f"{'yes' if p['chosen_within_5pct'] else 'no'} |")
    lines += ["", f"Chosen plan within 5% of the fastest measured candidate: **{within} of {total}** points "
                  f"({100 * within / max(total, 1):.0f}%); where another candidate was fastest, judged on the "
                  "runoff (the two again, in turn, as many rounds)."]
    return lines


def model_rows(docs):
    """Item 5: predicted / measured per strategy, the median over the suite's points; and the same
    divided by each point's speed check (the machine's speed now over its calibration's), where
    the bench ran one: what is left is the model's own error, not the machine's drift."""
    by_plan = {}
    for doc in docs:
        for p in doc["points"]:
            speed = (p.get("speed_check") or {}).get("now_over_profile")
            for r in p["runs"]:
                ratio = r["predicted_time_s"] / r["measured_time_s"]
                key = (doc["expression"], r["description"])
                raw, adjusted = by_plan.setdefault(key, ([], []))
                raw.append(ratio)
                if speed:
                    adjusted.append(ratio / speed)
    median = lambda v: sorted(v)[len(v) // 2]
    lines = ["| expression | strategy | points | predicted / measured (median) | range | "
             "÷ speed now / at calibration (median) |", "|---|---|---|---|---|---|"]
    within = lambda ratios: sum(1 for v in ratios if 0.85 <= v <= 1.15)
    for (expr, plan), (raw, adjusted) in sorted(by_plan.items()):
        lines.append(f"| `{expr}` | {plan} | {len(raw)} | {median(raw):.3g} | {min(raw):.3g} .. {max(raw):.3g} | "
                     f"{f'{median(adjusted):.3g}' if adjusted else '-'} |")
    medians = [median(raw) for raw, _ in by_plan.values()]
    adjusted = [median(a) for _, a in by_plan.values() if a]
    lines += ["", f"Median within 0.85..1.15: **{within(medians)} of {len(medians)}** strategies "
              f"({100 * within(medians) / max(len(medians), 1):.0f}%), the median over them {median(medians):.3g}"
              + (f"; divided by the speed check, {within(adjusted)} of {len(adjusted)}, median {median(adjusted):.3g}"
                 if adjusted else "") + "."]
    return lines


def judge_groups(docs):
    """Item 6, the held-out judge: its documents by backend and rank count (4 ranks share 2 cores
    here, so they are reported apart), in the order 2 ranks first."""
    groups = {}
    for doc in docs:
        groups.setdefault((doc["ranks"], doc["backend"]), []).append(doc)
    return sorted(groups.items())


def solve_table(doc):
    """Item 7: the solved sharding measured beside the named strategies."""
    caption = (f"`{doc['program']}` on {doc['mesh']} ({doc['backend']}), {doc['dtype']}, {doc['optimizer']}, "
               f"profile {doc['hardware']}, median of {doc['repeat']} steps")
    rows = [[("**" + s["names"] + "**") if s["optimum"] else s["names"], f"{s['predicted_s'] * 1e3:.2f}",
             f"{s['measured_s'] * 1e3:.2f}", f"{s['low_s'] * 1e3:.2f}-{s['high_s'] * 1e3:.2f}",
             f"{s['measured_s'] / s['predicted_s']:.2f}", f"{s['vs_fastest_named']:.3f}"] for s in doc["shardings"]]
    return markdown_table(caption, ["sharding", "predicted ms", "measured ms", "range", "measured / predicted",
                                    "vs the fastest named"], rows)


def markdown_table(caption, header, rows):
    return [caption, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def both(ours_ok, theirs_ok):
    return "both" if ours_ok and theirs_ok else "NO"


def scalapack_table(doc):
    caption = (f"`{doc['expression']}`, mesh {doc['mesh']} (BLACS grid {doc['grid'][0]}x{doc['grid'][1]}), f64, "
               f"median of {doc['repeat']}")
    rows = [[p["n"], p["plan"], gflops(p["pdgemm_flop_rate"]), gflops(p["ours_flop_rate"]),
             f"{p['ours_over_pdgemm']:.3f}", both(p["ours_verified"], p["pdgemm_verified"])] for p in doc["points"]]
    return markdown_table(caption, ["N", "our plan", "pdgemm GFLOP/s", "ours GFLOP/s", "ours / pdgemm", "verified"],
                          rows)


def torch_table(doc):
    caption = (f"`{doc['expression']}`, {doc['ranks']} processes, {doc['dtype']}, PyTorch {doc['torch_version']} "
               f"gloo ({doc['torch_plan']}), median of {doc['repeat']}")
    # torch's share in gloo's all_gather (absent from runs before it was recorded)
    gather = lambda p: f"{p['torch_all_gather_s'] / p['torch_time_s']:.0%}" if "torch_all_gather_s" in p else "-"
    rows = [[p["n"], gflops(p["torch_flop_rate"]), gather(p), gflops(p["shardmm_flop_rate"]),
             f"{p['ours_over_torch']:.3f}", "yes" if p["same_plan"] else "no",
             both(p["shardmm_verified"], p["torch_verified"])]
            for p in doc["points"]]
    return markdown_table(caption, ["N", "torch GFLOP/s", "torch time in all_gather", "shardmm GFLOP/s",
                                    "shardmm / torch", "same plan", "verified"], rows)


def crossover_data(doc, out_dir):
    """Plot 1's data: measured time per strategy against the swept size, the planner's chosen
    plan's measured time at each size (the same screening median as its strategy's column), and
    the size where the predicted cheapest strategy changes (log-linear interpolation between the
    sweep's points)."""
    swept = [d for d in doc["points"][0]["dims"] if len({p["dims"][d] for p in doc["points"]}) > 1][0]
    # Candidates come cheapest first, so their order changes along the sweep: match them by name.
    plans = sorted(r["description"] for r in doc["points"][0]["runs"])
    with open(os.path.join(out_dir, "crossover.dat"), "w") as f:
        f.write(f"# {swept}, then measured seconds per strategy, then predicted, then the chosen plan's measured "
                "seconds: " + "; ".join(plans) + "\n")
        for p in doc["points"]:
            runs = {r["description"]: r for r in p["runs"]}
            measured = [runs[name]["measured_time_s"] for name in plans]
            predicted = [runs[name]["predicted_time_s"] for name in plans]
            chosen = next(r for r in p["runs"] if r["candidate"] == p["chosen"])["measured_time_s"]
            f.write(" ".join(str(v) for v in [p["dims"][swept]] + measured + predicted + [chosen]) + "\n")
    crossings = []
    best = [min(p["runs"], key=lambda r: r["predicted_time_s"])["description"] for p in doc["points"]]
    for i in range(1, len(best)):
        if best[i] == best[i - 1]:
            continue
        p0, p1 = doc["points"][i - 1], doc["points"][i]
        gap = []
        for p in (p0, p1):
            t = {r["description"]: r["predicted_time_s"] for r in p["runs"]}
            gap.append(math.log(t[best[i - 1]]) - math.log(t[best[i]]))
        x0, x1 = math.log(p0["dims"][swept]), math.log(p1["dims"][swept])
        frac = -gap[0] / (gap[1] - gap[0]) if gap[1] != gap[0] else 0.5
        crossings.append((math.exp(x0 + frac * (x1 - x0)), best[i - 1], best[i]))
    with open(os.path.join(out_dir, "crossover.gp"), "w") as f:
        f.write(f'swept = "{swept}"\nplans = {len(plans)}\nchosen_column = {2 * len(plans) + 2}\n')
        for k, name in enumerate(plans):
            f.write(f'plan{k + 1} = "{name}"\n')
        f.write("crossings = %d\n" % len(crossings))
        for k, (x, _, _) in enumerate(crossings):
            f.write(f"crossing{k + 1} = {x}\n")
    return swept, crossings


def gflops_data(scalapack_docs, out_dir):
    """Plot 2's data: GFLOP/s against N, ours and pdgemm, per grid."""
    for doc in scalapack_docs:
        name = f"scalapack_{doc['grid'][0]}x{doc['grid'][1]}.dat"
        with open(os.path.join(out_dir, name), "w") as f:
            f.write("# N ours_GFLOPs pdgemm_GFLOPs\n")
            for p in doc["points"]:
                f.write(f"{p['n']} {p['ours_flop_rate'] / 1e9} {p['pdgemm_flop_rate'] / 1e9}\n")


def load_note(out_dir, stem):
    """The `uptime` bench-peers.sh recorded before the step, and its command."""
    note = []
    for ext, label in (("cmd", "command"), ("load", "uptime before it")):
        path = os.path.join(out_dir, f"{stem}.{ext}")
        if os.path.exists(path):
            with open(path) as f:
                note.append(f"{label}: `{f.read().strip()}`")
    return ["", "; ".join(note)] if note else []


def main(out_dir):
    get = lambda name: load(os.path.join(out_dir, name)) if os.path.exists(os.path.join(out_dir, name)) else None
    lines = []
    for name in sorted(glob.glob(os.path.join(out_dir, "gemm_*.json"))):
        stem = os.path.basename(name)[:-5]
        lines += ["### " + stem, ""] + gemm_table(load(name)) + load_note(out_dir, stem) + [""]
    choice = [load(n) for n in sorted(glob.glob(os.path.join(out_dir, "choice_*.json")))]
    if choice:
        notes = []
        for n in sorted(glob.glob(os.path.join(out_dir, "choice_*.json"))):
            notes += load_note(out_dir, os.path.basename(n)[:-5])
        lines += ["### Plan choice", ""] + choice_rows(choice) + notes + [""]
        lines += ["### Cost model: predicted / measured", ""] + model_rows(choice) + [""]
        crossover = get("choice_crossover.json")
        if crossover:
            swept, crossings = crossover_data(crossover, out_dir)
            for x, before, after in crossings:
                lines.append(f"Predicted crossover at {swept} = {x:.0f}: {before} -> {after}")
            lines.append("")
    judge = sorted(glob.glob(os.path.join(out_dir, "judge_*.json")))
    if judge:
        lines += ["### Cost model on held-out shapes: predicted / measured", ""]
        for (ranks, backend), docs in judge_groups([load(n) for n in judge]):
            lines += [f"#### {ranks} ranks, {backend} backend", ""] + model_rows(docs) + [""]
        for n in judge:
            lines += load_note(out_dir, os.path.basename(n)[:-5])
        lines += [""]
    solve = sorted(glob.glob(os.path.join(out_dir, "solve_*.json")))
    if solve:
        lines += ["### Solve: the chosen sharding against the named strategies, measured", ""]
        for n in solve:
            lines += solve_table(load(n)) + load_note(out_dir, os.path.basename(n)[:-5]) + [""]
    scalapack = [load(n) for n in sorted(glob.glob(os.path.join(out_dir, "scalapack_*.json")))]
    for doc in scalapack:
        grid = f"{doc['grid'][0]}x{doc['grid'][1]}"
        lines += [f"### ScaLAPACK pdgemm, grid {grid}", ""] + scalapack_table(doc) + load_note(out_dir, "scalapack_" + grid)
        lines += [""]
    gflops_data(scalapack, out_dir)
    torch = get("torch.json")
    if torch:
        lines += ["### PyTorch", ""] + torch_table(torch) + load_note(out_dir, "torch") + [""]
    with open(os.path.join(out_dir, "tables.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: scripts/peers_report.py DIR")
    main(sys.argv[1])
