#!/usr/bin/env bash
# Slurm on Kubernetes on the real cluster (issue 34, item 4): deploy/overlays/slurm-on-k8s as a user
# deploys it (testing/cluster/overlays/sim-slurm-on-k8s: the locally built gpulet-slurm image of
# deploy/Dockerfile.slurm, Debian 12's Slurm 22.05 and MUNGE; a smaller slurmd pod for this node).
# The slurmd pod gets 4 of the simulated DGX H100's GPUs from gpulet's device plugin, finds
# slurmctld through the cluster's DNS (the headless Service), registers as a dynamic node whose
# GRES are exactly its GPUs, runs an `srun --gres=gpu:h100:2` job that sees CUDA_VISIBLE_DEVICES,
# and, deleted while a job runs, drains first, lets the job finish, leaves Slurm, and only then
# goes. The test's own objects: the munge key Secret (made here, as the overlay's docs say) and a
# hostPath PersistentVolume for slurmctld's state (the test cluster has no provisioner); both, the
# namespace and the directory are removed at the end.
source "$(dirname "$0")/lib.sh"
ns=slurm
overlay="$repo/testing/cluster/overlays/sim-slurm-on-k8s"
work="$GPULET_CLUSTER_BASE/slurm-on-k8s"     # the PV's directory and the image; under the cluster's base
pv=gpulet-test-slurmctld-state
ctld() { kubectl --request-timeout=60s exec -n "$ns" slurmctld-0 -c slurmctld -- "$@"; }
now() { date +%s.%N; }
since() { python3 -c 'import sys; print("%.1f" % (float(sys.argv[2]) - float(sys.argv[1])))' "$@"; }
fail_evidence() {
  echo "--- slurm pods:"; kc get pods -n "$ns" -o wide 2>&1 | tail -5
  for c in slurmctld munged; do echo "--- slurmctld-0/$c:"; kc logs -n "$ns" slurmctld-0 -c "$c" --tail=15 2>&1; done
  for c in slurmd munged; do echo "--- slurmd-h100-0/$c:"; kc logs -n "$ns" slurmd-h100-0 -c "$c" --tail=25 2>&1; done
  echo "--- coredns:"; tail -5 "$GPULET_CLUSTER_BASE/logs/coredns.log" 2>&1
}
slurmd_pods_gone() { [ -z "$(kc get pods -n "$ns" -l app.kubernetes.io/component=slurmd -o name 2>/dev/null)" ]; }
cleanup() {
  # A slurmd pod waits on SIGTERM until slurmctld has its node (grace period one day): scaled to 0
  # while slurmctld runs, its entrypoint leaves Slurm and exits; one that cannot (slurmctld gone,
  # a failed run) is removed by force before the namespace goes.
  kc scale statefulset -n "$ns" slurmd-h100 --replicas=0 >/dev/null 2>&1 || true
  local end=$((SECONDS + 60))
  until slurmd_pods_gone || [ $SECONDS -ge $end ]; do sleep 1; done
  kc delete pod -n "$ns" -l app.kubernetes.io/component=slurmd --grace-period=0 --force --ignore-not-found \
    >/dev/null 2>&1 || true
  kc delete -k "$overlay" --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1 || true
  kc delete pv "$pv" --ignore-not-found --wait=true --timeout=60s >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
cleanup

say "the node agent (testing/cluster/overlays/sim-dgx-h100), 8 GPUs allocatable"
kc label node "$node" nvidia.com/gpu.present=true --overwrite >/dev/null
kc apply -k "$repo/testing/cluster/overlays/sim-dgx-h100" >/dev/null 2>&1 \
  || fail "kubectl apply -k of the node agent failed: $(kc apply -k "$repo/testing/cluster/overlays/sim-dgx-h100" 2>&1 | tail -3)"
until_true 180 "allocatable nvidia.com/gpu: 8" allocatable_is 8

say "the gpulet-slurm image (deploy/Dockerfile.slurm) built here and imported into containerd"
mkdir -p "$work/state"
t0=$(now)
"$repo/testing/cluster/gpulet_image.sh" --slurm "$build" "$work/gpulet-slurm.tar" || fail "gpulet_image.sh --slurm failed"
"$GPULET_CLUSTER_BIN/ctr" --address "$GPULET_CLUSTER_CONTAINERD" -n k8s.io images import --platform linux/amd64 \
  "$work/gpulet-slurm.tar" >/dev/null || fail "ctr images import of gpulet-slurm failed"
rm -f "$work/gpulet-slurm.tar"
echo "image built and imported in $(since "$t0" "$(now)") s"

say "namespace, munge key Secret, and a hostPath PersistentVolume for slurmctld's state"
kc create namespace "$ns" >/dev/null
until_true 60 "default ServiceAccount in $ns" kc get serviceaccount -n "$ns" default
(umask 077; head -c 1024 /dev/urandom > "$work/munge.key")
kc -n "$ns" create secret generic slurm-munge-key --from-file=munge.key="$work/munge.key" >/dev/null
rm -f "$work/munge.key"
kc apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolume
metadata: {name: $pv}
spec:
  capacity: {storage: 10Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  claimRef: {namespace: $ns, name: state-slurmctld-0}
  hostPath: {path: $work/state, type: Directory}
YAML

say "apply -k testing/cluster/overlays/sim-slurm-on-k8s (deploy/overlays/slurm-on-k8s)"
t_apply=$(now)
kc apply -k "$overlay" >/dev/null 2>&1 || fail "kubectl apply -k of the slurm overlay failed: $(kc apply -k "$overlay" 2>&1 | tail -3)"
until_true 180 "slurmctld-0 Running" pod_phase_is "$ns" slurmctld-0 Running
until_true 60 "slurmctld-0.slurmctld.slurm.svc.cluster.local in the cluster's DNS" \
  "$repo/testing/cluster/dns_query.py" 10.88.0.1 slurmctld-0.slurmctld.slurm.svc.cluster.local \
  "$(kc get pod -n "$ns" slurmctld-0 -o jsonpath='{.status.podIP}')"
echo "DNS: slurmctld-0.slurmctld.slurm.svc.cluster.local -> $("$repo/testing/cluster/dns_query.py" 10.88.0.1 slurmctld-0.slurmctld.slurm.svc.cluster.local)"

registered() { grep -qE 'State=IDLE(\+DYNAMIC_NORM)? ' <<< "$(ctld scontrol show node slurmd-h100-0 2>/dev/null)"; }
until_true 240 "slurmd-h100-0 registered with slurmctld (State=IDLE)" registered
t_reg=$(now)
created="$(kc get pod -n "$ns" slurmd-h100-0 -o jsonpath='{.metadata.creationTimestamp}')"
restarts="$(kc get pod -n "$ns" slurmd-h100-0 -o jsonpath='{.status.containerStatuses[?(@.name=="slurmd")].restartCount}')"
echo "slurmd-h100-0 registered $(since "$t_apply" "$t_reg") s after apply; pod created $(python3 -c '
import datetime, sys
c = datetime.datetime.strptime(sys.argv[1], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)
print("%.1f" % (float(sys.argv[2]) - c.timestamp()))' "$created" "$t_reg") s before (1 s resolution); slurmd restarts: $restarts"

say "GRES = the pod's GPUs from the device plugin"
node_info="$(ctld scontrol show node slurmd-h100-0)"
grep -q 'Gres=gpu:h100:4' <<< "$node_info" || fail "scontrol show node: no Gres=gpu:h100:4: $node_info"
grep -q 'AvailableFeatures=h100' <<< "$node_info" || fail "scontrol show node: not in the h100 NodeSet: $node_info"
grep -q 'Partitions=h100' <<< "$node_info" || fail "scontrol show node: not in partition h100: $node_info"
pexec() { kubectl --request-timeout=60s exec -n "$ns" slurmd-h100-0 -c slurmd -- "$@"; }
visible="$(pexec printenv NVIDIA_VISIBLE_DEVICES)"
[ "$(tr ',' '\n' <<< "$visible" | grep '^GPU-' | sort -u | wc -l)" = 4 ] \
  || fail "the slurmd container's NVIDIA_VISIBLE_DEVICES is '$visible', want 4 GPU UUIDs"
gres="$(pexec cat /run/gpulet-slurm/gres.conf)"
files="$(sed -n 's/.*File=\([^ ]*\).*/\1/p' <<< "$gres" | sort)"
[ "$(wc -l <<< "$files")" = 4 ] || fail "gres.conf names $(wc -l <<< "$files") devices, want 4: $gres"
for f in $files; do pexec test -c "$f" || fail "gres.conf's $f is not a device node in the slurmd container"; done
[ "$(pexec sh -c 'ls /dev | grep -c "^nvidia[0-9]"')" = 4 ] || fail "the slurmd container has not exactly 4 GPU device nodes"
echo "$(grep -o 'Gres=[^ ]*' <<< "$node_info"), NVIDIA_VISIBLE_DEVICES=$visible, gres.conf files: $(echo $files)"

say "srun --gres=gpu:h100:2: the job runs on the pod's node and sees CUDA_VISIBLE_DEVICES"
t0=$(now)
out="$(kubectl --request-timeout=120s exec -n "$ns" slurmctld-0 -c slurmctld -- \
  timeout 100 srun --gres=gpu:h100:2 -N1 -n1 -t 2 sh -c 'echo "JOB host=$(hostname) cvd=$CUDA_VISIBLE_DEVICES gpus=$SLURM_JOB_GPUS"' 2>&1)" \
  || fail "srun failed: $out"
t_job=$(since "$t0" "$(now)")
grep -q '^JOB host=slurmd-h100-0 cvd=0,1 ' <<< "$out" || fail "the job's output is not host=slurmd-h100-0 cvd=0,1: $out"
echo "$(grep '^JOB' <<< "$out") (srun round trip $t_job s through kubectl exec)"

say "deleting the slurmd pod while a job runs: drain first, the job finishes, the node leaves Slurm, then the pod goes"
job="$(ctld sbatch --parsable --gres=gpu:h100:1 -t 2 -o /dev/null --wrap 'sleep 20')" || fail "sbatch failed"
running() { grep -q 'JobState=RUNNING' <<< "$(ctld scontrol show job "$job")"; }
until_true 60 "job $job RUNNING" running
busy() { [ "$(kc get pod -n "$ns" slurmd-h100-0 -o jsonpath='{.metadata.labels.slurm\.gpulet\.io/busy}')" = true ]; }
until_true 30 "the slurmd pod labelled slurm.gpulet.io/busy=true by its entrypoint (RBAC + admission policy)" busy
uid="$(kc get pod -n "$ns" slurmd-h100-0 -o jsonpath='{.metadata.uid}')"
t_del=$(now)
kc delete pod -n "$ns" slurmd-h100-0 --wait=false >/dev/null
drained() {
  local n; n="$(ctld scontrol show node slurmd-h100-0)"
  grep -q 'State=[A-Z+]*DRAIN' <<< "$n" && grep -q 'Reason=gpulet: pod terminating' <<< "$n"
}
until_true 60 "slurmd-h100-0 DRAIN with reason 'gpulet: pod terminating'" drained
t_drain=$(now)
old_pod_there() { [ "$(kc get pod -n "$ns" slurmd-h100-0 -o jsonpath='{.metadata.uid}' 2>/dev/null)" = "$uid" ]; }
old_pod_there || fail "the pod was gone before its node had drained"
running || fail "job $job is not running any more when the node has drained (it must not be killed)"
echo "drained $(since "$t_del" "$t_drain") s after the delete, job $job still RUNNING, pod still there (Terminating)"
job_done() { ! grep -qw "$job" <<< "$(ctld squeue -h -o %i)"; }
until_true 120 "job $job finished" job_done
t_jobend=$(now)
grep -q 'JobState=COMPLETED' <<< "$(ctld scontrol show job "$job")" || fail "job $job did not complete: $(ctld scontrol show job "$job")"
unknown() { grep -q 'not found' <<< "$(ctld scontrol show node slurmd-h100-0 2>&1)"; }
until_true 60 "slurmd-h100-0 deleted from slurmctld by the entrypoint" unknown
t_left=$(now)
pod_gone() { ! old_pod_there; }
until_true 120 "the old slurmd-h100-0 pod gone" pod_gone
t_gone=$(now)
echo "order: delete +0, DRAIN +$(since "$t_del" "$t_drain") s, job COMPLETED +$(since "$t_del" "$t_jobend") s, node left Slurm +$(since "$t_del" "$t_left") s, pod gone +$(since "$t_del" "$t_gone") s"

say "the StatefulSet's new slurmd-h100-0 registers again; scaled to 0 it leaves Slurm"
until_true 240 "the new slurmd-h100-0 registered" registered
kc scale statefulset -n "$ns" slurmd-h100 --replicas=0 >/dev/null
until_true 120 "slurmd pods gone" slurmd_pods_gone
unknown || fail "slurmd-h100-0 is still in slurmctld after its pod left: $(ctld scontrol show node slurmd-h100-0 2>&1)"

trap - EXIT
say "cleanup: namespace, the cluster-scoped objects, the PersistentVolume and its directory"
cleanup
[ -z "$(kc get pv "$pv" --ignore-not-found -o name)" ] || fail "PersistentVolume $pv left"
[ ! -e "$work" ] || fail "$work left"
echo PASS
