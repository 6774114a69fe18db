#!/usr/bin/env python3
"""Footprint of the node agent: RSS of `gpulet plugin` and `gpulet node` on a simulated DGX H100,
registered with the kubelet harness (ListAndWatch open, one Allocate done), after they settle.

usage: footprint_bench.py BUILD_DIR [ROUNDS]
Prints a markdown table (median and max over the rounds) and the largest mappings of the last
round. The harness stands in for the kubelet, as in the device-plugin bench.
"""
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

BUILD = sys.argv[1]
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
GPULET = os.path.join(BUILD, "gpulet")
HARNESS = os.path.join(BUILD, "bin", "gpulet-kubelet-harness")


def status(pid: int) -> dict:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "Threads"):
                out[k] = int(v.split()[0])
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                out["Pss"] = int(line.split()[1])
    return out


def mappings(pid: int) -> list:
    rss = {}
    name = ""
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and len(parts) >= 5:
                name = os.path.basename(parts[5]) if len(parts) > 5 else "[anon]"
            elif parts[0] == "Rss:":
                rss[name] = rss.get(name, 0) + int(parts[1])
    return sorted(rss.items(), key=lambda kv: -kv[1])


def measure(command: str) -> tuple:
    d = tempfile.mkdtemp(prefix="gpulet-footprint-")
    os.makedirs(f"{d}/dp")
    try:
        harness = subprocess.Popen(
            [HARNESS, "--dir", f"{d}/dp", "--expect", "8", "--allocate", "1", "--watch",
             "--timeout", "60"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        argv = [GPULET, "--simulate", "dgx-h100", "--sim-state", f"{d}/sim", command,
                "--device-plugin-path", f"{d}/dp"]
        if command == "node":
            argv += ["-a", "127.0.0.1:0"]
        agent = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(8)  # registration, ListAndWatch, one allocation, a few collections
        s = status(agent.pid)
        maps = mappings(agent.pid)
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=30)
        harness.send_signal(signal.SIGTERM)
        harness.wait(timeout=30)
        return s, maps
    finally:
        shutil.rmtree(d, ignore_errors=True)


def binary_line() -> str:
    """The binary: loaded size (text, data), file size, shared libraries it links, last link time."""
    text, data = (int(v) for v in subprocess.run(
        ["size", GPULET], capture_output=True, text=True, check=True).stdout.splitlines()[1].split()[:2])
    needed = [l.split("[")[1].rstrip("]") for l in subprocess.run(
        ["readelf", "-d", GPULET], capture_output=True, text=True, check=True).stdout.splitlines()
        if "(NEEDED)" in l]
    link = ""
    try:  # ninja's log: start and end (ms) of each output's last build
        with open(os.path.join(BUILD, ".ninja_log")) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) >= 4 and parts[3] == "gpulet":
                    link = f", linked in {(int(parts[1]) - int(parts[0])) / 1000:.1f} s"
    except OSError:
        pass
    return (f"Binary `gpulet`: text {text / 2**20:.1f} MiB, data {data / 2**10:.0f} KiB, file "
            f"{os.path.getsize(GPULET) / 2**20:.0f} MiB with debug info{link}; links "
            f"{len(needed)} shared libraries ({', '.join(needed)}).")


def main() -> None:
    print("| command | RSS MiB (median) | RSS MiB (max) | anonymous MiB | file-backed MiB | PSS MiB |"
          " threads |")
    print("|---|---|---|---|---|---|---|")
    last_maps = {}
    for command in ("plugin", "node"):
        runs = []
        for _ in range(ROUNDS):
            s, maps = measure(command)
            runs.append(s)
            last_maps[command] = maps
        mib = lambda k: [r[k] / 1024 for r in runs]
        print(f"| `gpulet {command}` | {statistics.median(mib('VmRSS')):.1f} | {max(mib('VmRSS')):.1f}"
              f" | {statistics.median(mib('RssAnon')):.1f} | {statistics.median(mib('RssFile')):.1f}"
              f" | {statistics.median(mib('Pss')):.1f} | {runs[-1]['Threads']} |")
    print()
    print("Largest resident mappings of `gpulet node` (last round, MiB): " + ", ".join(
        f"{name} {kib / 1024:.1f}" for name, kib in last_maps["node"][:10]) + ".")
    print()
    print(binary_line())


if __name__ == "__main__":
    main()
