"""Stage partitioning on published graphs, against the published optima.

    python -m benchmarks.stage_quality [--repeats 5] [--full] [--markdown]

For each graph in ``../shared/benchmarks/tarnawski/`` (identical accelerators, their
max-load objective, the files' own accelerator and CPU counts) this prints the optimum
listed in that README with its DP time, tfpart's stage DP result and its time (median
of ``--repeats`` runs, after one run that loads the compiled kernels), and whether the
result is proven optimal. InceptionV3 (36,596 ideals; their DP did not finish in 25
minutes) is solved exactly only with ``--full``; otherwise the chain (PipeDream-style)
split is shown. A second table compares the DP with the stage ILP on random small
heterogeneous instances.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from partitioner.stage_dp import StageProblem, solve
from partitioner.stage_ilp import solve_ilp
from tfpart.importers import load_tarnawski_stages

SHARED = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "tarnawski"
# graph -> (optimal max-load, DP seconds) as listed in ../shared/benchmarks/README.md
LISTED = {"LayerGraphs/bert24_inference": (17.7899, 0.01),
          "LayerGraphs/bert24_training": (41.7458, 0.01),
          "LayerGraphs/gnmt_inference": (32.9107, 33),
          "LayerGraphs/gnmt_training": (107.004, 51),
          "LayerGraphs/resnet50_inference": (33.7747, 0.17),
          "LayerGraphs/resnet50_training": (78.6318, 0.25),
          "LayerGraphs/inceptionv3_inference": (None, None),
          "LayerGraphs/inceptionv3_training": (None, None),
          "OperatorGraphs/bert_l-3_inference": (27.9186, 2.2),
          "OperatorGraphs/bert_l-3_training": (65.3031, 9.8),
          "OperatorGraphs/bert_l-6_inference": (29.5795, 4.6),
          "OperatorGraphs/bert_l-6_training": (72.865, 33)}


def timed(problem, repeats, ideal_limit):
    solve(problem, ideal_limit=ideal_limit)  # loads the compiled kernels once
    times, solution = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        solution = solve(problem, ideal_limit=ideal_limit)
        times.append(time.perf_counter() - start)
    return solution, statistics.median(times)


def published_rows(repeats, full):
    rows = []
    for name, (listed, listed_s) in LISTED.items():
        problem, _ = load_tarnawski_stages(SHARED / f"{name}.json")
        limit = 100_000 if full else 20_000
        solution, seconds = timed(problem, 1 if "inception" in name else repeats, limit)
        rows.append({"graph": name, "units": problem.n, "listed": listed,
                     "listed_s": listed_s, "ours": solution.max_load, "seconds": seconds,
                     "exact": solution.exact, "ideals": solution.ideals})
    return rows


def random_problem(rng):
    n = int(rng.integers(4, 9))
    preds = [sorted(set(rng.integers(0, u, size=int(rng.integers(0, 3))).tolist()))
             if u else [] for u in range(n)]
    groups = [(u, *[v for v in range(n) if u in preds[v]]) for u in range(n)
              if any(u in preds[v] for v in range(n))]
    speed = np.array([1.0, rng.uniform(1.5, 4.0)])  # kind 1 is a slower device
    base = rng.uniform(0.5, 5.0, size=n)
    return StageProblem(preds=preds, time=np.outer(speed, base),
                        size=rng.uniform(0, 3, size=n), groups=groups,
                        comm=np.outer([1.0, 1.3], rng.uniform(0, 2, size=len(groups))),
                        capacity=np.array([12.0, 8.0]), count=(2, 2))


def ilp_rows(count, seed=0):
    rng = np.random.default_rng(seed)
    equal, dp_s, ilp_s = 0, [], []
    for _ in range(count):
        problem = random_problem(rng)
        start = time.perf_counter()
        dp = solve(problem).max_load
        dp_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        ilp = solve_ilp(problem)
        ilp_s.append(time.perf_counter() - start)
        equal += abs(dp - ilp) <= 1e-6 * max(1.0, ilp)
    return equal, count, statistics.median(dp_s), statistics.median(ilp_s)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--full", action="store_true", help="solve InceptionV3 exactly too")
    parser.add_argument("--ilp-cases", type=int, default=30)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    if not SHARED.is_dir():
        print(f"no published graphs at {SHARED}", file=sys.stderr)
        return 2
    console = Console(width=160)
    rows = published_rows(args.repeats, args.full)
    table = Table(title="Stage partitioning on Tarnawski et al.'s graphs (max-load)")
    for column in ("graph", "units", "listed optimum", "listed time", "tfpart", "time",
                   "time / listed", "proven optimal"):
        table.add_column(column, justify="left" if column == "graph" else "right")
    lines = ["| graph | units | listed optimum | listed DP time | tfpart max-load | "
             "tfpart time | time / listed | proven optimal |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [r["graph"], str(r["units"]),
                 "—" if r["listed"] is None else f"{r['listed']:.4f}",
                 "—" if r["listed_s"] is None else f"{r['listed_s']:g} s",
                 f"{r['ours']:.4f}", f"{r['seconds']:.4f} s",
                 "—" if r["listed_s"] is None else f"{r['seconds'] / r['listed_s']:.3f}",
                 f"yes ({r['ideals']} ideals)" if r["exact"] else "no (chain split)"]
        table.add_row(*cells)
        lines.append("| " + " | ".join(cells) + " |")
    console.print(table)
    equal, count, dp_s, ilp_s = ilp_rows(args.ilp_cases)
    summary = (f"Heterogeneous check (2 fast + 2 slow devices, random DAGs of 4-8 units): DP "
               f"equals the ILP optimum on {equal} of {count}; median DP {dp_s * 1e3:.2f} ms, "
               f"ILP {ilp_s * 1e3:.0f} ms")
    console.print(summary)
    if args.markdown:
        print("\n".join(lines) + f"\n\n{summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
