#!/usr/bin/env python3
"""Allocation at 130 % arrived on each pod list, under the artifact's protocol.

usage: variants_table.py DIR
  DIR holds one VARIANT.csv per pod list, as bench_placement_reproduce prints it
  (policy,arrived_pct,mean,sd,n) for the six policies and fgd-bestfit.
Prints a Markdown table (seed means, the best of each row in bold) and how FGD and fgd-bestfit
compare over the lists.
"""
import csv
import os
import sys

ORDER = ["random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd", "fgd-bestfit"]
NAMES = ["Random", "DotProd", "GpuClustering", "GpuPacking", "BestFit", "FGD", "fgd-bestfit"]
LISTS = ["default", "cpu050", "cpu100", "cpu200", "cpu250", "gpushare40", "gpushare60",
         "gpushare80", "gpushare100", "gpuspec10", "gpuspec20", "gpuspec25", "gpuspec33",
         "multigpu20", "multigpu30", "multigpu40", "multigpu50"]


def main() -> int:
    d = sys.argv[1]
    print("| pod list | " + " | ".join(NAMES) + " | seeds |")
    print("|---|" + "---:|" * len(NAMES) + "---:|")
    fgd_wins, fb_wins, best_count = 0, 0, {}
    sums, lists = {}, 0
    for v in LISTS:
        path = os.path.join(d, v + ".csv")
        if not os.path.exists(path):
            continue
        at = {}
        seeds = 0
        with open(path) as f:
            for row in csv.DictReader(f):
                if row["arrived_pct"] == "130":
                    at[row["policy"]] = float(row["mean"])
                    seeds = int(row["n"])
        if not at:
            continue
        lists += 1
        for p, value in at.items():
            sums[p] = sums.get(p, 0.0) + value
        best = max(at.values())
        cells = []
        for p in ORDER:
            if p not in at:
                cells.append("—")
                continue
            text = f"{at[p]:.2f} %"
            cells.append(f"**{text}**" if at[p] == best else text)
        winner = max(at, key=at.get)
        best_count[winner] = best_count.get(winner, 0) + 1
        if "fgd" in at and "fgd-bestfit" in at:
            if at["fgd"] > at["fgd-bestfit"]:
                fgd_wins += 1
            elif at["fgd-bestfit"] > at["fgd"]:
                fb_wins += 1
        print(f"| {v} | " + " | ".join(cells) + f" | {seeds} |")
    if lists:
        means = {p: sums[p] / lists for p in ORDER if p in sums}
        top = max(means.values())
        print(f"| mean of the {lists} lists | " + " | ".join(
            (f"**{means[p]:.2f} %**" if means[p] == top else f"{means[p]:.2f} %") if p in means
            else "—" for p in ORDER) + " | |")
    print()
    print(f"FGD above fgd-bestfit on {fgd_wins} pod lists, below on {fb_wins}; the best policy per "
          "list: " + ", ".join(f"{NAMES[ORDER.index(p)]} {n}" for p, n in
                               sorted(best_count.items(), key=lambda x: -x[1])) + ".")
    return 0


if __name__ == "__main__":
    sys.exit(main())
