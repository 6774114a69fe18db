#!/usr/bin/env python3
"""Google Benchmark JSON (with repetitions and p50/p99 statistics) → a Markdown table.

Usage: gbench_table.py RESULTS.json
Prints one row per benchmark: repetitions, median, p99 and mean, in the benchmark's time unit.
"""
import json
import sys


def main() -> None:
    data = json.load(open(sys.argv[1]))
    rows = {}
    for b in data["benchmarks"]:
        if b.get("run_type") != "aggregate":
            continue
        name = b["run_name"]
        rows.setdefault(name, {})[b["aggregate_name"]] = b["real_time"]
        rows[name]["unit"] = b["time_unit"]
        rows[name]["n"] = b.get("repetitions", "")
    print("| benchmark | calls | median | p99 | mean |")
    print("|---|---:|---:|---:|---:|")
    for name, r in rows.items():
        u = r["unit"]
        print(f"| {name.split('/iterations')[0]} | {r['n']} | {r['p50']:.1f} {u} "
              f"| {r['p99']:.1f} {u} | {r['mean']:.1f} {u} |")


if __name__ == "__main__":
    main()
