#!/usr/bin/env python3
"""Exporter footprint and scrape latency on simulated nodes.

usage: exporter_bench.py BUILD_DIR [SCRAPES]
For each fixture (dgx-h100; dgx-a100 with MIG) it starts `gpulet exporter -c 1000` pinned to one
core, measures idle CPU and RSS, then scrapes /metrics sequentially from another core (latency
p50/p99, scrapes/s) and with 16 concurrent clients (throughput, peak RSS). Prints Markdown.
"""
import http.client
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

BUILD = sys.argv[1]
SCRAPES = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
GPULET = os.path.join(BUILD, "gpulet")
TICK = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count() or 1


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def status_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def get(conn, path="/metrics"):
    conn.request("GET", path)
    r = conn.getresponse()
    body = r.read()
    return r.status, body


def pin(core):
    return ["taskset", "-c", str(core)] if CORES > 1 and shutil.which("taskset") else []


def run(fixture, tmp):
    port = free_port()
    cmd = pin(0) + [GPULET, "--simulate", fixture, "--sim-state", os.path.join(tmp, fixture),
                    "--log-level", "warn", "exporter", "-c", "1000", "-a", f"127.0.0.1:{port}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                if get(c, "/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline or proc.poll() is not None:
                raise RuntimeError(f"exporter on {fixture} did not start")
            time.sleep(0.1)
        time.sleep(3)  # warm-up: a few collections
        # Idle: collections every second, no scrapes.
        idle_s = 20
        c0 = cpu_seconds(proc.pid)
        time.sleep(idle_s)
        idle_cpu = (cpu_seconds(proc.pid) - c0) / idle_s * 100
        idle_rss = status_kib(proc.pid, "VmRSS") / 1024
        # The exporter's own memory: RSS less the shared libraries' file pages (libcrypto, gRPC,
        # protobuf, … are mapped once per node, whoever maps them).
        idle_anon = status_kib(proc.pid, "RssAnon") / 1024
        # The exporter closes keep-alive connections idle for 5 s (its bound on idle clients):
        # scrape on a new one after the idle period.
        c.close()
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        status, body = get(c)
        series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
        size_kib = len(body) / 1024
        # Sequential scrapes over one keep-alive connection, client on another core.
        if CORES > 1:
            os.sched_setaffinity(0, {1})
        lat = []
        t0 = time.perf_counter()
        for _ in range(SCRAPES):
            s = time.perf_counter()
            st, _ = get(c)
            lat.append((time.perf_counter() - s) * 1000)
            assert st == 200
        seq_rate = SCRAPES / (time.perf_counter() - t0)
        lat.sort()
        p50 = statistics.median(lat)
        p99 = lat[int(len(lat) * 0.99) - 1]
        # 16 concurrent scrapers for 5 s.
        done = [0]
        stop = time.time() + 5
        lock = threading.Lock()

        def worker():
            cc = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            n = 0
            while time.time() < stop:
                get(cc)
                n += 1
            with lock:
                done[0] += n

        threads = [threading.Thread(target=worker) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        conc_rate = done[0] / 5
        peak_rss = status_kib(proc.pid, "VmHWM") / 1024
        return dict(fixture=fixture, series=series, size_kib=size_kib, idle_cpu=idle_cpu,
                    idle_rss=idle_rss, idle_anon=idle_anon, p50=p50, p99=p99, seq_rate=seq_rate, conc_rate=conc_rate,
                    peak_rss=peak_rss)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def main():
    tmp = tempfile.mkdtemp(prefix="gpulet-exporter-bench-")
    try:
        rows = [run(f, tmp) for f in ("dgx-h100", "dgx-a100")]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"`gpulet exporter -c 1000` (1 s collection, built-in counters) pinned to one core; "
          f"{SCRAPES} sequential keep-alive scrapes from a Python client on another core, then 16 "
          f"concurrent scrapers for 5 s. Targets: RSS < 20 MiB, scrape p99 < 2 ms, idle CPU < 0.5 %.")
    print()
    print("| fixture | series | body KiB | idle CPU % of a core | RSS MiB idle | of which anonymous MiB | "
          "RSS MiB peak | scrape p50 ms | scrape p99 ms | scrapes/s (1 client) | scrapes/s (16 clients) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['fixture']} | {r['series']} | {r['size_kib']:.1f} | {r['idle_cpu']:.2f} | "
              f"{r['idle_rss']:.1f} | {r['idle_anon']:.1f} | {r['peak_rss']:.1f} | {r['p50']:.3f} | {r['p99']:.3f} | "
              f"{r['seq_rate']:.0f} | {r['conc_rate']:.0f} |")
    print()
    print("Latency is measured in the client (includes Python's HTTP overhead). The simulated "
          "driver reads a state file per NVML call, so idle CPU here is an upper bound for a real driver.")


if __name__ == "__main__":
    main()
