#!/usr/bin/env python3
"""Writes an OCI image archive that `ctr images import` accepts, from directories, without a registry.

  oci_image.py --name localhost/gpulet/pause:test --entrypoint /pause --layer DIR [--layer DIR ...] OUT.tar
  oci_image.py layer DIR OUT.tar     (one layer tar, to cache and pass later as --layer OUT.tar)

Each layer is an uncompressed, deterministic tar of one directory (sorted names, mtime 0, uid/gid 0).
The image name travels in the index's io.containerd.image.name annotation (containerd takes the name
from it on import).
"""
import argparse
import hashlib
import io
import json
import os
import sys
import tarfile


def layer_tar(root):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        entries = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(dirnames + filenames):
                entries.append(os.path.join(dirpath, name))
        for path in sorted(entries):
            arc = os.path.relpath(path, root)
            info = tar.gettarinfo(path, arcname=arc)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if info.isreg():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buf.getvalue()


def blob(out, data):
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo("blobs/sha256/" + digest)
    info.size = len(data)
    out.addfile(info, io.BytesIO(data))
    return "sha256:" + digest, len(data)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "layer":  # oci_image.py layer DIR OUT.tar
        data = layer_tar(sys.argv[2])
        with open(sys.argv[3] + ".tmp", "wb") as f:
            f.write(data)
        os.replace(sys.argv[3] + ".tmp", sys.argv[3])
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True)
    p.add_argument("--entrypoint", action="append", default=[])
    p.add_argument("--cmd", action="append", default=[])
    p.add_argument("--env", action="append", default=["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"])
    p.add_argument("--layer", action="append", required=True, help="a directory (or an existing .tar)")
    p.add_argument("out")
    a = p.parse_args()

    with tarfile.open(a.out, "w") as out:
        layers, diff_ids = [], []
        for l in a.layer:
            if os.path.isdir(l):
                data = layer_tar(l)
            else:
                with open(l, "rb") as f:
                    data = f.read()
            d, n = blob(out, data)
            layers.append({"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": d, "size": n})
            diff_ids.append(d)
        config = {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Env": a.env, "Entrypoint": a.entrypoint or None, "Cmd": a.cmd or None},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }
        cd, cn = blob(out, json.dumps(config, sort_keys=True).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cn},
            "layers": layers,
        }
        md, mn = blob(out, json.dumps(manifest, sort_keys=True).encode())
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": mn,
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {"io.containerd.image.name": a.name,
                                "org.opencontainers.image.ref.name": a.name.rsplit(":", 1)[-1]},
            }],
        }
        for name, data in (("index.json", json.dumps(index).encode()),
                           ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
