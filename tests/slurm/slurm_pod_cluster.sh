#!/bin/bash
# A real Slurm (Debian 12's 22.05) for `gpulet slurm pod`: one slurmctld that takes dynamic nodes
# (MaxNodeCount, a NodeSet by feature), and "pods": network namespaces on one bridge, so each
# slurmd has an address of its own as in Kubernetes (slurmctld reaches every dynamic node on
# SlurmdPort; two slurmd on one address would collide).
#
#   slurm_pod_cluster.sh start DIR [GPULET] # DIR: an empty directory the caller made (mkdtemp)
#   slurm_pod_cluster.sh pod DIR NAME       # a namespace for pod NAME; prints the netns name
#   slurm_pod_cluster.sh forward DIR PORT   # bridge address → 127.0.0.1:PORT; prints "ADDR:PORT"
#   slurm_pod_cluster.sh stop DIR
#
# After start, DIR/slurm.conf is the one configuration (slurmctld's and every pod's, as a
# ConfigMap would be), DIR/env holds SLURM_CONF=…; partition "gpu" takes nodes with feature
# "gpu". Each pod gets DIR/NAME/dev/nvidia0-7 and nvidia-caps/nvidia-cap1-255 (character
# devices: slurmd ignores regular files). Everything started here is stopped by pid or name.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=slurm_cluster.sh
source "$here/slurm_cluster.sh"

# Names from the directory (parallel runs get their own): bridge gpb<id>, netns gpn<id>-<pod>,
# subnet 10.<a>.<b>.0/24.
ids() {
  local dir=$1 sum
  sum=$(printf '%s' "$dir" | cksum | cut -d' ' -f1)
  id=$(printf '%06x' $((sum % 16777216)))
  net_a=$((100 + sum % 100))
  net_b=$(((sum / 100) % 250 + 1))
}

start_pods() {
  local dir=$1 i
  [ -d "$dir" ] || die "$dir: no such directory"
  for b in slurmctld slurmd scontrol sbatch sinfo ip; do
    command -v $b >/dev/null || die "$b not found"
  done
  [ "$(id -u)" = 0 ] || die "must run as root (network namespaces, slurmd, mknod)"
  trap 'echo "slurm_pod_cluster: start failed, stopping" >&2; stop_pods "$dir"' EXIT
  ids "$dir"
  : >"$dir/pids"
  mkdir -p "$dir/state" "$dir/out"
  ip link add "gpb$id" type bridge || die "cannot create bridge gpb$id"
  echo "gpb$id" >"$dir/bridge"
  ip addr add "10.$net_a.$net_b.1/24" dev "gpb$id" || die "ip addr failed"
  ip link set "gpb$id" up || die "ip link up failed"
  local pc
  pc=$(free_port)
  cat >"$dir/slurm.conf" <<EOC
ClusterName=p$(basename "$dir" | tr -dc 'a-z0-9' | head -c 20)
SlurmctldHost=localhost(10.$net_a.$net_b.1)
SlurmctldPort=$pc
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=100
ReturnToService=2
SlurmdTimeout=30
GresTypes=gpu,mps,shard
MaxNodeCount=32
TreeWidth=65533
NodeSet=ns_gpu Feature=gpu
PartitionName=gpu Nodes=ns_gpu Default=YES MaxTime=INFINITE State=UP
EOC
  export SLURM_CONF=$dir/slurm.conf
  echo "SLURM_CONF=$SLURM_CONF" >"$dir/env"
  slurmctld -D -i -f "$SLURM_CONF" </dev/null >"$dir/slurmctld.out" 2>&1 &
  echo $! >>"$dir/pids"
  local ok=0 ping=""
  for i in $(seq 1 150); do
    ping=$(scontrol ping 2>&1)
    case "$ping" in *"is UP"*) ok=1; break ;; esac
    daemons_alive "$dir" || break
    sleep 0.2
  done
  if [ $ok = 0 ]; then
    echo "scontrol ping: $ping" >&2
    show_logs "$dir/slurmctld.log" "$dir/slurmctld.out"
    die "slurmctld did not come up"
  fi
  trap - EXIT
  echo "slurm_pod_cluster: up in $dir (ctld 10.$net_a.$net_b.1:$pc, bridge gpb$id)"
}

add_pod() {
  local dir=$1 name=$2 n i
  ids "$dir"
  n=$(($(ls "$dir"/netns-* 2>/dev/null | wc -l) + 11))
  local ns="gpn$id-$n" veth="gpv$id$n"
  ip netns add "$ns" || die "ip netns add $ns failed"
  echo "$ns" >"$dir/netns-$name"
  ip link add "$veth" type veth peer name eth0 netns "$ns" || die "veth $veth failed"
  ip link set "$veth" master "gpb$id" up || die "ip link set $veth failed"
  ip -n "$ns" addr add "10.$net_a.$net_b.$n/24" dev eth0 || die "pod address failed"
  ip -n "$ns" link set eth0 up && ip -n "$ns" link set lo up || die "pod link up failed"
  mkdir -p "$dir/$name/dev/nvidia-caps" "$dir/$name/etc"
  for i in 0 1 2 3 4 5 6 7; do mknod "$dir/$name/dev/nvidia$i" c 195 $i || die "mknod failed"; done
  for i in $(seq 1 255); do mknod "$dir/$name/dev/nvidia-caps/nvidia-cap$i" c 241 $i; done
  echo "$ns"
}

# A TCP forwarder from the bridge address to 127.0.0.1:PORT (a test's API server listens on
# loopback, which pods in their namespaces cannot reach). Prints the port it listens on.
forward() {
  local dir=$1 port=$2 out
  ids "$dir"
  out=$(mktemp "$dir/forward-XXXXXX")
  python3 -u -c '
import socket, sys, threading
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind((sys.argv[1], 0)); ls.listen(16); print(ls.getsockname()[1], flush=True)
def pipe(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d: break
            b.sendall(d)
    except OSError: pass
    finally:
        for s in (a, b):
            try: s.shutdown(socket.SHUT_RDWR)
            except OSError: pass
while True:
    c, _ = ls.accept()
    u = socket.create_connection(("127.0.0.1", int(sys.argv[2])))
    for a, b in ((c, u), (u, c)): threading.Thread(target=pipe, args=(a, b), daemon=True).start()
' "10.$net_a.$net_b.1" "$port" </dev/null >"$out" 2>&1 &
  echo $! >>"$dir/pids"
  local i
  for i in $(seq 1 50); do [ -s "$out" ] && break; sleep 0.1; done
  echo "10.$net_a.$net_b.1:$(head -n 1 "$out")"
}

stop_pods() {
  local dir=$1 f
  stop "$dir"
  # Pod processes (gpulet slurm pod and its slurmd) run in the namespaces: stopped by pid first.
  for f in "$dir"/netns-*; do
    [ -f "$f" ] || continue
    for pid in $(ip netns pids "$(cat "$f")" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
    ip netns del "$(cat "$f")" 2>/dev/null
    rm -f "$f"
  done
  [ -f "$dir/bridge" ] && ip link del "$(cat "$dir/bridge")" 2>/dev/null
  rm -f "$dir/bridge"
}

case "${1:-}" in
  start) [ $# = 2 ] || [ $# = 3 ] || die "usage: $0 start DIR [GPULET]"; start_pods "$(cd "$2" && pwd)" ;;
  pod) [ $# = 3 ] || die "usage: $0 pod DIR NAME"; add_pod "$(cd "$2" && pwd)" "$3" ;;
  forward) [ $# = 3 ] || die "usage: $0 forward DIR PORT"; forward "$(cd "$2" && pwd)" "$3" ;;
  stop) [ $# = 2 ] || die "usage: $0 stop DIR"; stop_pods "$(cd "$2" && pwd)" ;;
  *) die "usage: $0 start DIR | pod DIR NAME | stop DIR" ;;
esac
