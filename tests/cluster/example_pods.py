#!/usr/bin/env python3
"""Prints a deploy/examples/dra file ready for the test cluster: every object in NAMESPACE, each pod
renamed NAME-<i> (--copies N), run from the local test image (never pulled) printing its environment
and /dev before it waits. What the example asks for (claims, templates, resources) is unchanged.
With --cuda "ARGS", the pods run the tenant's CUDA image instead (localhost/gpulet/cuda-test:test,
no driver in it) with `memlimit_probe ARGS` as their command.

  example_pods.py FILE NAMESPACE [--copies N] [--only-pods] [--cuda "ARGS"]
"""
import argparse
import sys

import yaml

CMD = ["/bin/sh", "-c", "env | sort; echo DEV:; ls /dev; exec sleep 100000"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("file")
    p.add_argument("namespace")
    p.add_argument("--copies", type=int, default=1)
    p.add_argument("--only-pods", action="store_true")
    p.add_argument("--cuda", help="memlimit_probe's arguments, run from the CUDA test image")
    a = p.parse_args()
    out = []
    with open(a.file) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    for d in docs:
        d.setdefault("metadata", {})["namespace"] = a.namespace
        if d["kind"] != "Pod":
            if not a.only_pods:
                out.append(d)
            continue
        d["spec"]["terminationGracePeriodSeconds"] = 1
        for c in d["spec"]["containers"]:
            c["image"] = "localhost/gpulet/cuda-test:test" if a.cuda else "localhost/gpulet/test:test"
            c["imagePullPolicy"] = "Never"
            c["command"] = ["/usr/local/bin/memlimit_probe"] + a.cuda.split() if a.cuda else CMD
            c.pop("args", None)
        name = d["metadata"]["name"]
        for i in range(a.copies):
            copy = yaml.safe_load(yaml.safe_dump(d))
            copy["metadata"]["name"] = f"{name}-{i}" if a.copies > 1 else name
            out.append(copy)
    yaml.safe_dump_all(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
