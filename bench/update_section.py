#!/usr/bin/env python3
"""Replace one benchmark's section of docs/benchmarks.md.

usage: update_section.py NAME CONTENT_FILE [BENCHMARKS_MD]
The section lives between '<!-- bench:NAME -->' and '<!-- /bench:NAME -->'; it is appended when
missing. A header with the machine and date is prepended to the content.
"""
import datetime
import os
import platform
import re
import subprocess
import sys


def machine() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {cpu}, {platform.system()} {platform.release()}"


def main() -> None:
    name, content_file = sys.argv[1], sys.argv[2]
    path = sys.argv[3] if len(sys.argv) > 3 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "docs", "benchmarks.md")
    with open(content_file) as f:
        content = f.read().strip()
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=False).stdout.strip()
    except OSError:
        commit = ""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = f"_Measured {stamp} on {machine()}; commit {commit or 'n/a'}._"
    block = f"<!-- bench:{name} -->\n{header}\n\n{content}\n<!-- /bench:{name} -->"
    try:
        with open(path) as f:
            doc = f.read()
    except FileNotFoundError:
        doc = "# Benchmarks\n\nRun `make bench`; each section below is rewritten by its benchmark.\n"
    pattern = re.compile(rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->",
                         re.S)
    if pattern.search(doc):
        doc = pattern.sub(lambda _: block, doc)
    else:
        doc = doc.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(doc)


if __name__ == "__main__":
    main()
