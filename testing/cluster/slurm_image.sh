#!/usr/bin/env bash
# The gpulet-slurm image as deploy/Dockerfile.slurm describes it (gpulet's image of deploy/Dockerfile
# with Debian 12's Slurm and MUNGE), without a registry or a container engine: a Debian 12 root file
# system with both Dockerfiles' run-time packages (debootstrap, cached by package list under the
# cluster cache, as gpulet_image.sh caches gpulet's), and a layer with the build's gpulet, sim/ and
# fixtures/ at deploy/Dockerfile's paths. Every file of the layers is root's (oci_image.py), which is
# what Dockerfile.slurm's chown of MUNGE's directories gives too.
#
#   slurm_image.sh BUILD_DIR OUT.tar    writes an OCI archive named localhost/gpulet/gpulet-slurm:test
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="$(cd "$1" && pwd)"; out="$2"
cache="${GPULET_CLUSTER_CACHE:-$([ "$(id -u)" = 0 ] && echo /var/cache/gpulet-cluster || echo "${XDG_CACHE_HOME:-$HOME/.cache}/gpulet-cluster")}"
dockerfile_packages() {  # the packages of the apt-get install lines of a Dockerfile's last stage
  sed -n '/^FROM /h; /^FROM /!H; ${x;p}' "$1" | tr -d '\\' | sed -n '/apt-get install/,/rm -rf/p' | tr ' ' '\n' | \
    grep -E '^[a-z0-9][a-z0-9.+-]+$' | grep -vE '^(apt-get|install|rm|rf|y|qq|no|update)$'
}
packages="$( (dockerfile_packages "$here/../../deploy/Dockerfile"; dockerfile_packages "$here/../../deploy/Dockerfile.slurm") \
  | sort -u | tr '\n' ',' | sed 's/,$//')"
for p in slurmctld slurmd munge libssl3; do
  grep -qw "$p" <<< "$packages" || { echo "slurm_image.sh: $p not in the Dockerfiles' packages ($packages)" >&2; exit 1; }
done
key="$(echo "bookworm minbase $packages" | sha256sum | cut -c1-16)"
layer="$cache/rootfs/debian12-$key.tar"
if [ ! -f "$layer" ]; then
  command -v debootstrap >/dev/null || { echo "slurm_image.sh: debootstrap missing (make deps installs it)" >&2; exit 1; }
  mirror="${GPULET_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
  tmp="$cache/rootfs/tmp-$key.$$"
  rm -rf "$tmp"; mkdir -p "$cache/rootfs"
  t0=$SECONDS
  echo "slurm_image.sh: debootstrap bookworm ($packages) once into the cache ..." >&2
  debootstrap --variant=minbase --include="$packages" bookworm "$tmp" "$mirror" > "$tmp.log" 2>&1 \
    || { tail -20 "$tmp.log" >&2; rm -rf "$tmp"; exit 1; }
  rm -rf "$tmp"/var/cache/apt/archives/*.deb "$tmp"/var/lib/apt/lists/* "$tmp"/var/log/* "$tmp"/dev/*
  python3 "$here/oci_image.py" layer "$tmp" "$layer"
  rm -rf "$tmp" "$tmp.log"
  echo "slurm_image.sh: Debian 12 root file system with Slurm cached in $((SECONDS - t0)) s: $layer" >&2
fi
app="$(mktemp -d)"
trap 'rm -rf "$app"' EXIT
mkdir -p "$app/opt/gpulet" "$app/usr/bin"
cp "$build/gpulet" "$app/opt/gpulet/gpulet"
cp -r "$build/sim" "$app/opt/gpulet/sim"
cp -r "$build/fixtures" "$app/opt/gpulet/fixtures"
ln -s /opt/gpulet/gpulet "$app/usr/bin/gpulet"
python3 "$here/oci_image.py" --name localhost/gpulet/gpulet-slurm:test --cmd /bin/sh \
  --layer "$layer" --layer "$app" "$out"
