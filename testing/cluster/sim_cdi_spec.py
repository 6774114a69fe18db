#!/usr/bin/env python3
"""The CDI spec that `nvidia-ctk cdi generate --driver-root=ROOT` writes on a GPU node (kind
nvidia.com/gpu: a device per GPU, named by index and by UUID, and "all"; the driver's control
nodes and libraries for every container), made for the real-cluster tier's simulated node, whose
driver root is the cluster's stand-in (testing/cluster/cluster.sh: character devices with
/dev/null's numbers, the simulated libcuda and libnvidia-ml under the names a driver installs).

What only a simulated node needs, and a real one has in its hardware: the simulated driver reads
its GPUs from the fixture (GPULET_SIM_FIXTURE, the fixture file mounted read-only) and, as the real
driver sees only the GPUs whose device nodes a container was given, enumerates only those
(GPULET_SIM_DEVICE_NODES=/dev).

  sim_cdi_spec.py --build BUILD --fixture-name dgx-h100 --driver-root ROOT --out SPEC.json

copies BUILD/fixtures/<name>.yaml into ROOT/usr/share/gpulet-sim/ (the simulated hardware's
description, mounted into containers), reads the GPUs from `BUILD/gpulet --simulate <name> info`
and writes the spec to SPEC.json.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

LIB_DIR = "/usr/lib/x86_64-linux-gnu"
FIXTURE_IN_CONTAINER = "/usr/share/gpulet-sim/fixture.yaml"


def node(root, path):
    return {"path": path, "hostPath": root + path}


def bind(host, container):
    return {"hostPath": host, "containerPath": container, "options": ["ro", "nosuid", "nodev", "bind"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True, help="the build directory (gpulet, fixtures/)")
    ap.add_argument("--fixture-name", required=True)
    ap.add_argument("--driver-root", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    share = os.path.join(args.driver_root, "usr/share/gpulet-sim")
    os.makedirs(share, exist_ok=True)
    fixture = os.path.join(share, args.fixture_name + ".yaml")
    shutil.copyfile(os.path.join(args.build, "fixtures", args.fixture_name + ".yaml"), fixture)
    with tempfile.TemporaryDirectory() as state:
        info = json.loads(subprocess.run(
            [os.path.join(args.build, "gpulet"), "--log-level", "off", "--simulate", args.fixture_name,
             "--sim-state", state, "info", "-o", "json"], check=True, capture_output=True).stdout)
    root = args.driver_root.rstrip("/")
    version = info["driver_version"]
    devices, every = [], []
    for g in info["gpus"]:
        edit = {"deviceNodes": [node(root, g["device"])]}
        every.append(node(root, g["device"]))
        devices.append({"name": str(g["index"]), "containerEdits": edit})
        devices.append({"name": g["uuid"], "containerEdits": edit})
    devices.append({"name": "all", "containerEdits": {"deviceNodes": every}})
    mounts = []
    for lib in ("libcuda.so", "libnvidia-ml.so"):
        host = "%s%s/%s.%s" % (root, LIB_DIR, lib, version)
        # The file and its soname: nvidia-ctk adds the soname link with a hook; a bind mount at
        # both paths needs no hook (no nvidia-cdi-hook exists on this node).
        mounts.append(bind(host, "%s/%s.%s" % (LIB_DIR, lib, version)))
        mounts.append(bind(host, "%s/%s.1" % (LIB_DIR, lib)))
    # The simulated NVML's YAML reader, loaded from NVML's own directory (a simulated part).
    yaml_helper = "%s%s/libgpulet-sim-yaml.so" % (root, LIB_DIR)
    if os.path.exists(yaml_helper):
        mounts.append(bind(yaml_helper, "%s/libgpulet-sim-yaml.so" % LIB_DIR))
    mounts.append(bind(fixture, FIXTURE_IN_CONTAINER))
    spec = {
        "cdiVersion": "0.6.0",
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": {
            "env": ["GPULET_SIM_FIXTURE=" + FIXTURE_IN_CONTAINER, "GPULET_SIM_DEVICE_NODES=/dev"],
            "deviceNodes": [node(root, "/dev/nvidiactl"), node(root, "/dev/nvidia-uvm")],
            "mounts": mounts,
        },
    }
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(spec, f, indent=1)
        f.write("\n")
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
