#!/usr/bin/env bash
# Builds upstream's kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl, an
# etcd server, containerd, its runc shim and ctr from the Go modules pinned in k8s/ and
# containerd/ (go.mod and go.sum committed), into a cache outside the clone keyed by the pinned
# versions and the Go toolchain, so a fresh clone on the same machine reuses it. CoreDNS (the
# cluster's DNS, coredns/) has a key of its own, so that its pin moves nothing else: it is built
# into bin/coredns-KEY/ and linked into the bin directory as `coredns`.
#
#   testing/cluster/build.sh          build if the cache lacks this key; print the bin directory last
#   GPULET_CLUSTER_CACHE=DIR          the cache (default /var/cache/gpulet-cluster)
#
# GOTOOLCHAIN=local: a go.mod asking for a newer Go fails loudly instead of downloading one.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${GPULET_CLUSTER_CACHE:-$([ "$(id -u)" = 0 ] && echo /var/cache/gpulet-cluster || echo "${XDG_CACHE_HOME:-$HOME/.cache}/gpulet-cluster")}"
# Bump when the way the binaries are built changes (flags, tags, ldflags): part of the cache key.
recipe=1

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then PATH="/usr/local/go/bin:$PATH"; fi
if ! command -v go >/dev/null 2>&1; then
  echo "build.sh: no Go toolchain. Install Go >= 1.26 (go.dev/dl tarball into /usr/local/go) and re-run;" >&2
  echo "          Debian 12's golang (1.19) cannot build Kubernetes 1.37." >&2
  exit 2
fi
gov="$(go env GOVERSION)"
case "$gov" in
  go1.2[6-9]*|go1.[3-9]*) ;;
  *) echo "build.sh: $gov is too old: Kubernetes 1.37's modules declare go 1.26.0; install Go >= 1.26" >&2; exit 2;;
esac

export GOTOOLCHAIN=local GOFLAGS="-trimpath -mod=mod" CGO_ENABLED=0
export GOMODCACHE="$cache/mod" GOCACHE="$cache/gocache"
mkdir -p "$cache/bin"
# The key: the toolchain, this recipe, and every module version the two modules resolve (so that
# tidying a go.mod, or adding a test tool to the module, does not rebuild what did not change).
mods_k8s="$(cd "$here/k8s" && go list -m all)" || { echo "build.sh: go list -m all failed in k8s/" >&2; exit 1; }
mods_ctd="$(cd "$here/containerd" && go list -m all)" || { echo "build.sh: go list -m all failed in containerd/" >&2; exit 1; }
key="$(printf '%s\n' "$gov recipe $recipe" "$(cat "$here/k8s/etcd/main.go")" "$mods_k8s" "$mods_ctd" | sha256sum | cut -c1-16)"
bin="$cache/bin/$key"
mods_dns="$(cd "$here/coredns" && go list -m all)" || { echo "build.sh: go list -m all failed in coredns/" >&2; exit 1; }
dns_bin="$cache/bin/coredns-$(printf '%s\n' "$gov recipe $recipe" "$(cat "$here/coredns/main.go")" "$mods_dns" | sha256sum | cut -c1-16)"

want=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl containerd containerd-shim-runc-v2 ctr)
components_built() { local b; for b in "${want[@]}"; do [ -x "$bin/$b" ] || return 1; done; }
complete() { components_built && [ -x "$dns_bin/coredns" ] && [ "$(readlink "$bin/coredns")" = "$dns_bin/coredns" ]; }
if complete; then
  echo "$bin"
  exit 0
fi
# One build at a time per cache: a second caller waits for the first and then finds the binaries.
exec 9>"$cache/build.lock"
if ! flock -n 9; then
  echo "build.sh: another build of the upstream components is running; waiting for it ..." >&2
  flock 9
fi
if complete; then
  echo "$bin"
  exit 0
fi

step() {  # step NAME COMMAND...: runs and reports how long it took
  local name="$1"; shift
  local t0=$SECONDS
  echo "build.sh: building $name ..." >&2
  "$@" >&2
  echo "build.sh: $name built in $((SECONDS - t0)) s" >&2
}

t_all=$SECONDS
build_components() {
  tmp="$bin.tmp.$$"
  rm -rf "$tmp"; mkdir -p "$tmp"
  trap 'rm -rf "$tmp"' EXIT

  kv="$(awk '$1=="k8s.io/kubernetes"{print $2}' "$here/k8s/go.mod")"
  minor="$(echo "$kv" | cut -d. -f2)"
  ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$kv -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
    ld="$ld -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  (cd "$here/k8s" && step "etcd" go build -ldflags "-s -w" -o "$tmp/etcd" ./etcd)
  for c in kube-apiserver kube-scheduler kube-controller-manager kubelet kubectl; do
    (cd "$here/k8s" && step "$c $kv" go build -ldflags "$ld" -o "$tmp/$c" "k8s.io/kubernetes/cmd/$c")
  done

  cv="$(awk '$1=="require"{print $3}' "$here/containerd/go.mod")"
  cld="-s -w -X github.com/containerd/containerd/v2/version.Version=$cv"
  cld="$cld -X github.com/containerd/containerd/v2/version.Package=github.com/containerd/containerd/v2"
  (cd "$here/containerd" && step "containerd $cv" go build -tags "urfave_cli_no_docs no_btrfs" \
    -ldflags "$cld" -o "$tmp/containerd" github.com/containerd/containerd/v2/cmd/containerd)
  (cd "$here/containerd" && step "ctr $cv" go build -tags "urfave_cli_no_docs no_btrfs" \
    -ldflags "$cld" -o "$tmp/ctr" github.com/containerd/containerd/v2/cmd/ctr)
  (cd "$here/containerd" && step "containerd-shim-runc-v2 $cv" go build -tags "urfave_cli_no_docs no_grpc" \
    -ldflags "$cld" -o "$tmp/containerd-shim-runc-v2" github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2)

  rm -rf "$bin"; mv "$tmp" "$bin"
  trap - EXIT
}
components_built || build_components

if [ ! -x "$dns_bin/coredns" ]; then
  dv="$(awk '$1=="require"{print $3}' "$here/coredns/go.mod")"
  rm -rf "$dns_bin.tmp.$$"; mkdir -p "$dns_bin.tmp.$$"
  trap 'rm -rf "$dns_bin.tmp.$$"' EXIT
  (cd "$here/coredns" && step "coredns $dv" go build -ldflags "-s -w" -o "$dns_bin.tmp.$$/coredns" .)
  rm -rf "$dns_bin"; mv "$dns_bin.tmp.$$" "$dns_bin"
  trap - EXIT
fi
ln -sfn "$dns_bin/coredns" "$bin/coredns"
echo "build.sh: upstream components ready in $((SECONDS - t_all)) s in $bin" >&2
echo "$bin"
