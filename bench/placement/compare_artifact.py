#!/usr/bin/env python3
"""Our reproduction of the FGD artifact against the artifact's own seed means.

usage: compare_artifact.py OURS_CSV ARTIFACT_SUMMARY_CSV [TOLERANCE]
  OURS_CSV: what bench_placement_reproduce prints (policy,arrived_pct,mean,sd,n)
  ARTIFACT_SUMMARY_CSV: ../shared/upstream/fgd-artifact/default-alloc_ratio_summary.csv
    (workload,policy,metric,arrived_pct_of_gpu_capacity,mean,sd,n_seeds; read there, never copied)
Prints a Markdown table, one row per arrived-load point, one column per policy with
"artifact / ours (difference)" in percent of the GPUs allocated, then the largest difference per
policy and whether every point is within TOLERANCE (default 0.5) percentage points.
"""
import csv
import sys

ORDER = ["random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd"]
NAMES = {"random": "Random", "dotprod": "DotProd", "gpuclustering": "GpuClustering",
         "gpupacking": "GpuPacking", "bestfit": "BestFit", "fgd": "FGD"}


def main() -> int:
    ours_path, art_path = sys.argv[1], sys.argv[2]
    tolerance = float(sys.argv[3]) if len(sys.argv) > 3 else 0.5
    art = {}
    with open(art_path) as f:
        for row in csv.DictReader(f):
            if row["metric"] != "gpu_alloc_pct":
                continue
            policy = row["policy"].split("-", 1)[1].lower()
            art[(policy, int(row["arrived_pct_of_gpu_capacity"]))] = float(row["mean"])
    ours = {}
    with open(ours_path) as f:
        for row in csv.DictReader(f):
            ours[(row["policy"], int(row["arrived_pct"]))] = float(row["mean"])
    policies = [p for p in ORDER if any(k[0] == p for k in ours)]
    points = sorted({k[1] for k in art if k[0] in policies})
    print("| arrived | " + " | ".join(NAMES[p] for p in policies) + " |")
    print("|---:|" + "---:|" * len(policies))
    worst = {p: (0.0, None) for p in policies}
    missing = []
    for pct in points:
        cells = []
        for p in policies:
            a, o = art.get((p, pct)), ours.get((p, pct))
            if a is None or o is None:
                cells.append("—")
                missing.append(f"{p}@{pct}")
                continue
            d = o - a
            if abs(d) > abs(worst[p][0]):
                worst[p] = (d, pct)
            cells.append(f"{a:.2f} / {o:.2f} ({d:+.2f})")
        print(f"| {pct} % | " + " | ".join(cells) + " |")
    print()
    print("Largest difference (ours − artifact, percentage points): " + ", ".join(
        f"{NAMES[p]} {w[0]:+.2f} at {w[1]} %" for p, w in worst.items() if w[1] is not None))
    ok = not missing and all(abs(w[0]) <= tolerance for w in worst.values())
    print(f"Every point within ±{tolerance}: {'yes' if ok else 'no'}" +
          (f" (missing: {', '.join(missing)})" if missing else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
