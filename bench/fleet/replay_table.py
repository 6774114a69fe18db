#!/usr/bin/env python3
"""The fleet-replay section of docs/benchmarks.md (bench/fleet/run.sh, replay_section).

usage: replay_table.py FLEET_REPLAY_JSON COMPARE_OUTPUT POLICY SEED NODES SECONDS
FLEET_REPLAY_JSON: the line `fleet replay` printed; COMPARE_OUTPUT: what `gpulet extender replay
--compare-placements` printed for the same setup.
"""
import json
import re
import sys


def main() -> None:
    r = json.loads(sys.argv[1])
    cmp, policy, seed, nodes, took = sys.argv[2:7]
    m = re.search(r"(\d+) GPU nodes, (\d+) one-GPU arrivals", cmp)
    same = re.search(r"identical placements (\d+)", cmp)
    if not m:
        sys.exit("replay_table.py: not the output of gpulet extender replay --compare-placements: " + cmp)
    n_nodes, n_pods = m.group(1), m.group(2)
    print("## The real kube-scheduler with the extender's placement policy vs `gpulet replay` (issue 34)")
    print()
    print(f"The openb default trace's one-GPU arrivals (seed {seed}, arriving until 130 % of the GPU")
    print(f"capacity of the first {nodes} GPU nodes, as `gpulet extender replay --compare-placements")
    print(f"--nodes {nodes} --export FILE` takes them: {n_nodes} nodes, {n_pods} pods; a pod's units are its")
    print("milli-GPU share, 1,000 per GPU), placed twice on the same nodes (their GPU models and counts;")
    print("each node an API object without a kubelet, `testing/cluster/k8s/fleet nodes -setup`):")
    print(f"- by upstream kube-scheduler v1.37.2 calling `gpulet extender --policy={policy} --workload")
    print("  openb_pod_list_default.csv` as deploy/extender configures it (the profile's score plugins off,")
    print("  every node scored, mutual TLS), pods created one at a time (`fleet replay`: the next once the")
    print("  last is bound or unschedulable; an unschedulable pod is deleted, as the replay drops it);")
    print("- by `gpulet replay --protocol artifact`'s code (the replay side of `--compare-placements`).")
    print()
    print("Allocation = units placed / the nodes' units (one-GPU pods only: the extender places no")
    print("multi-GPU or CPU-only pod, so `gpulet replay`'s whole-trace figures are not these).")
    print()
    print("| placed by | pods placed | not placed | allocation | on the replay's node |")
    print("|---|---|---|---|---|")
    print(f"| kube-scheduler + `gpulet extender --policy={policy}` | {r['placed']} | {r['failed']} "
          f"| {100 * r['allocation']:.2f} % | {r['same_node']} of {r['pods']} |")
    print(f"| `gpulet replay` (artifact protocol, {policy}) | {r['replay_placed']} "
          f"| {r['pods'] - r['replay_placed']} | {100 * r['replay_allocation']:.2f} % | - |")
    print()
    print(f"- the extender's verbs in process on the same setup (`--compare-placements`): "
          f"{same.group(1) if same else '?'} of {n_pods} placements identical (node and GPU)")
    print(f"- per pod, created -> bound or unschedulable: p50 {r['p50_ms']:.0f} ms, p99 {r['p99_ms']:.0f} ms; "
          f"{r['pods']} pods in {r['seconds']:.0f} s; pods failed with a reason other than "
          f"Unschedulable: {r['scheduler_errors']}; bound after being found unschedulable: "
          f"{r['late_binds']}; the whole comparison (export, fleet, pods) {took} s")
    if r["differences"]:
        print("- first differences: " + "; ".join(r["differences"]))


if __name__ == "__main__":
    main()
