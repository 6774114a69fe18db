#!/usr/bin/env bash
# gpulet's image as deploy/Dockerfile describes it, without a registry or a container engine: a
# Debian 12 root file system with the Dockerfile's run-time packages (debootstrap, cached by package
# list under the cluster cache), and a layer with the build's gpulet, sim/, fixtures/ and
# libgpulet-cuda.so at the Dockerfile's paths.
#
#   gpulet_image.sh BUILD_DIR OUT.tar [CUDA_OUT.tar]
#       writes an OCI archive named localhost/gpulet/gpulet:test, and with CUDA_OUT.tar a tenant's
#       CUDA test image, localhost/gpulet/cuda-test:test: the same Debian layer and the build's
#       memlimit_probe (a CUDA program linked against libcuda.so.1, which the node's CDI spec
#       injects, as on a GPU node: the image carries no driver)
#   gpulet_image.sh --slurm BUILD_DIR OUT.tar
#       the gpulet-slurm image of deploy/Dockerfile.slurm (gpulet's image with Debian's Slurm and
#       MUNGE), localhost/gpulet/gpulet-slurm:test: the Debian layer has both Dockerfiles' packages.
#       Every file of the layers is root's (oci_image.py), which is what Dockerfile.slurm's chown of
#       MUNGE's directories gives too.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
slurm=0; if [ "${1:-}" = --slurm ]; then slurm=1; shift; fi
build="$(cd "$1" && pwd)"; out="$2"; cuda_out="${3:-}"
cache="${GPULET_CLUSTER_CACHE:-$([ "$(id -u)" = 0 ] && echo /var/cache/gpulet-cluster || echo "${XDG_CACHE_HOME:-$HOME/.cache}/gpulet-cluster")}"
# The run-time packages: the apt-get install lines of the Dockerfiles' last stage (tests/deploy
# checks deploy/Dockerfile; this list follows it).
dockerfile_packages() {
  sed -n '/^FROM /h; /^FROM /!H; ${x;p}' "$1" | tr -d '\\' | sed -n '/apt-get install/,/rm -rf/p' | tr ' ' '\n' | \
    grep -E '^[a-z0-9][a-z0-9.+-]+$' | grep -vE '^(apt-get|install|rm|rf|y|qq|no|update)$'
}
packages="$( (dockerfile_packages "$here/../../deploy/Dockerfile"
  [ "$slurm" = 0 ] || dockerfile_packages "$here/../../deploy/Dockerfile.slurm") | sort -u | tr '\n' ',' | sed 's/,$//')"
[ -n "$packages" ] || { echo "gpulet_image.sh: no run-time packages found in deploy/Dockerfile" >&2; exit 1; }
[ "$slurm" = 0 ] || grep -qw slurmd <<< "$packages" || { echo "gpulet_image.sh: no slurmd in deploy/Dockerfile.slurm" >&2; exit 1; }
key="$(echo "bookworm minbase $packages" | sha256sum | cut -c1-16)"
layer="$cache/rootfs/debian12-$key.tar"
if [ ! -f "$layer" ]; then
  command -v debootstrap >/dev/null || { echo "gpulet_image.sh: debootstrap missing (make deps installs it)" >&2; exit 1; }
  mirror="${GPULET_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
  tmp="$cache/rootfs/tmp-$key.$$"
  rm -rf "$tmp"; mkdir -p "$cache/rootfs"
  t0=$SECONDS
  echo "gpulet_image.sh: debootstrap bookworm ($packages) once into the cache ..." >&2
  debootstrap --variant=minbase --include="$packages" bookworm "$tmp" "$mirror" > "$tmp.log" 2>&1 \
    || { tail -20 "$tmp.log" >&2; rm -rf "$tmp"; exit 1; }
  rm -rf "$tmp"/var/cache/apt/archives/*.deb "$tmp"/var/lib/apt/lists/* "$tmp"/var/log/* "$tmp"/dev/*
  python3 "$here/oci_image.py" layer "$tmp" "$layer"
  rm -rf "$tmp" "$tmp.log"
  echo "gpulet_image.sh: Debian 12 root file system cached in $((SECONDS - t0)) s: $layer" >&2
fi
app="$(mktemp -d)"; tenant="$(mktemp -d)"
trap 'rm -rf "$app" "$tenant"' EXIT
mkdir -p "$app/opt/gpulet/lib" "$app/usr/bin"
cp "$build/gpulet" "$app/opt/gpulet/gpulet"
cp -r "$build/sim" "$app/opt/gpulet/sim"
cp -r "$build/fixtures" "$app/opt/gpulet/fixtures"
[ -f "$build/lib/libgpulet-cuda.so" ] && cp "$build/lib/libgpulet-cuda.so" "$app/opt/gpulet/lib/"
ln -s /opt/gpulet/gpulet "$app/usr/bin/gpulet"
if [ "$slurm" = 1 ]; then
  python3 "$here/oci_image.py" --name localhost/gpulet/gpulet-slurm:test --cmd /bin/sh \
    --layer "$layer" --layer "$app" "$out"
  exit 0
fi
python3 "$here/oci_image.py" --name localhost/gpulet/gpulet:test --entrypoint gpulet --cmd node \
  --layer "$layer" --layer "$app" "$out"
if [ -n "$cuda_out" ] && [ -x "$build/bin/memlimit_probe" ]; then
  mkdir -p "$tenant/usr/local/bin"
  cp "$build/bin/memlimit_probe" "$tenant/usr/local/bin/memlimit_probe"
  python3 "$here/oci_image.py" --name localhost/gpulet/cuda-test:test --cmd /usr/local/bin/memlimit_probe \
    --layer "$layer" --layer "$tenant" "$cuda_out"
fi
