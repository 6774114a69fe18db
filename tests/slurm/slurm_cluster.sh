#!/bin/bash
# A real Slurm (Debian 12's 22.05) on loopback for the integration tests: one slurmctld and two
# slurmd in DIR, described to Slurm by the gres.conf and NodeName lines `gpulet slurm gres`
# generates for two simulated nodes.
#
#   slurm_cluster.sh start DIR GPULET   # DIR: an empty directory the caller made (mkdtemp)
#   slurm_cluster.sh stop DIR
#
# Nodes: gpua = tests/slurm/fixtures/slurm-h100.yaml (4 x H100, NVSwitch) with 4 shards per GPU;
#        gpub = tests/slurm/fixtures/slurm-l4.yaml (2 x L4, PCIe) with MPS.
# Shard and MPS live on different nodes: Slurm 22.05 computes CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
# from the shard counts when a node has both.
# Device files are character devices made with mknod (c 195 N) under DIR/<node>/dev: slurmd
# ignores regular files (jobs then get no CUDA_VISIBLE_DEVICES).
# After start, DIR/env holds SLURM_CONF=…; the daemons' pids are in DIR/pids. Every daemon and
# job process started here is stopped by pid (also when start fails half-way).
set -u
here=$(cd "$(dirname "$0")" && pwd)

die() { echo "slurm_cluster: $*" >&2; exit 1; }

# The last lines of each log, one file at a time (`tail -20 A B` is refused by coreutils), and
# says so for a log that was never written: a failure must always show its cause.
show_logs() {
  local f
  for f in "$@"; do
    if [ -s "$f" ]; then
      echo "--- last lines of $f:" >&2
      tail -n 20 -- "$f" >&2
    else
      echo "--- $f: empty or missing" >&2
    fi
  done
}

# Whether every pid in DIR/pids is still running (a daemon that exits at start is a failure now,
# not after the whole wait).
daemons_alive() {
  local pid
  while read -r pid; do kill -0 "$pid" 2>/dev/null || return 1; done <"$1/pids"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Processes this cluster started that outlive their daemons: slurmstepd (holds the slurmd log in
# DIR open) and job processes (their environment names DIR/slurm.conf). Nothing else matches.
kill_dir_users() {
  local dir=$1 p link comm v environ
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [ "$p" = "$$" ] && continue
    # Builtins only (no fork per process): this walks every process on the machine.
    read -r comm 2>/dev/null </proc/$p/comm || continue
    if [ "$comm" = slurmstepd ]; then
      for link in /proc/$p/fd/*; do
        case "$(readlink "$link" 2>/dev/null)" in
          "$dir"/*) kill -9 "$p" 2>/dev/null; break ;;
        esac
      done
    else
      mapfile -d '' environ 2>/dev/null </proc/$p/environ || continue
      for v in "${environ[@]}"; do
        if [ "$v" = "SLURM_CONF=$dir/slurm.conf" ]; then kill -9 "$p" 2>/dev/null; break; fi
      done
    fi
  done
}

stop() {
  local dir=$1 pid i
  [ -d "$dir" ] || return 0
  if [ -f "$dir/slurm.conf" ] && [ -f "$dir/pids" ]; then
    export SLURM_CONF=$dir/slurm.conf
    if timeout 10 scancel --quiet --full --user=root >/dev/null 2>&1; then
      for i in $(seq 1 100); do
        [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break
        sleep 0.1
      done
    fi
  fi
  if [ -f "$dir/pids" ]; then
    while read -r pid; do kill -TERM "$pid" 2>/dev/null; done <"$dir/pids"
    for i in $(seq 1 100); do
      alive=0
      while read -r pid; do kill -0 "$pid" 2>/dev/null && alive=1; done <"$dir/pids"
      [ $alive = 0 ] && break
      sleep 0.1
    done
    while read -r pid; do kill -KILL "$pid" 2>/dev/null; done <"$dir/pids"
  fi
  kill_dir_users "$dir"
  rm -f "$dir/pids"
}

start() {
  local dir=$1 gpulet=$2
  [ -d "$dir" ] || die "$dir: no such directory"
  [ -x "$gpulet" ] || die "$gpulet: not executable"
  for b in slurmctld slurmd scontrol sbatch sinfo; do
    command -v $b >/dev/null || die "$b not found (apt-get install slurmctld slurmd slurm-client)"
  done
  [ "$(id -u)" = 0 ] || die "must run as root (slurmd, mknod)"
  trap 'echo "slurm_cluster: start failed, stopping" >&2; stop "$dir"' EXIT
  : >"$dir/pids"
  mkdir -p "$dir/state" "$dir/spool-gpua" "$dir/spool-gpub" "$dir/out"

  local i
  mkdir -p "$dir/gpua/dev" "$dir/gpub/dev"
  for i in 0 1 2 3; do mknod "$dir/gpua/dev/nvidia$i" c 195 $i || die "mknod failed"; done
  for i in 0 1; do mknod "$dir/gpub/dev/nvidia$i" c 195 $i || die "mknod failed"; done

  local gen="$gpulet --log-level warn"
  $gen --simulate "$here/fixtures/slurm-h100.yaml" --sim-state "$dir/sim-gpua" slurm gres \
    --node-name gpua --dev-root "$dir/gpua" --shards 4 --print gres -o "$dir/gres-gpua.conf" \
    || die "gpulet slurm gres (gpua) failed"
  $gen --simulate "$here/fixtures/slurm-l4.yaml" --sim-state "$dir/sim-gpub" slurm gres \
    --node-name gpub --dev-root "$dir/gpub" --mps --print gres -o "$dir/gres-gpub.conf" \
    || die "gpulet slurm gres (gpub) failed"
  local node_a node_b
  node_a=$($gen --simulate "$here/fixtures/slurm-h100.yaml" --sim-state "$dir/sim-gpua" slurm \
    gres --node-name gpua --dev-root "$dir/gpua" --shards 4 --print slurm | grep '^NodeName=')
  node_b=$($gen --simulate "$here/fixtures/slurm-l4.yaml" --sim-state "$dir/sim-gpub" slurm \
    gres --node-name gpub --dev-root "$dir/gpub" --mps --print slurm | grep '^NodeName=')
  [ -n "$node_a" ] && [ -n "$node_b" ] ||
    die "no NodeName line from gpulet (gpua: \"$node_a\", gpub: \"$node_b\")"
  cat "$dir/gres-gpua.conf" "$dir/gres-gpub.conf" >"$dir/gres.conf"

  local pc pa pb
  pc=$(free_port); pa=$(free_port); pb=$(free_port)
  cat >"$dir/slurm.conf" <<EOF
ClusterName=g$(basename "$dir" | tr -dc 'a-z0-9' | head -c 20)
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$pc
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
SlurmdParameters=config_overrides
DefMemPerCPU=100
ReturnToService=2
SlurmdTimeout=30
GresTypes=gpu,mps,shard
$node_a NodeHostname=localhost NodeAddr=127.0.0.1 Port=$pa
$node_b NodeHostname=localhost NodeAddr=127.0.0.1 Port=$pb
PartitionName=gpu Nodes=gpua,gpub Default=YES MaxTime=INFINITE State=UP
EOF
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
    daemons_alive "$dir" && die "slurmctld did not come up" || die "slurmctld exited at start"
  fi
  for n in gpua gpub; do
    slurmd -D -f "$SLURM_CONF" -N $n </dev/null >"$dir/slurmd-$n.out" 2>&1 &
    echo $! >>"$dir/pids"
  done
  ok=0
  for i in $(seq 1 300); do
    states=$(sinfo -h -N -o '%N=%T' 2>/dev/null | sort -u | tr '\n' ' ')
    case "$states" in
      "gpua=idle gpub=idle ") ok=1; break ;;
    esac
    daemons_alive "$dir" || break
    sleep 0.2
  done
  if [ $ok = 0 ]; then
    echo "node states: $states" >&2
    show_logs "$dir"/slurmd-gpua.log "$dir"/slurmd-gpua.out "$dir"/slurmd-gpub.log \
      "$dir"/slurmd-gpub.out "$dir/slurmctld.log"
    daemons_alive "$dir" && die "slurmd nodes did not become idle" || die "a daemon exited at start"
  fi
  trap - EXIT
  echo "slurm_cluster: up in $dir (ctld :$pc, gpua :$pa, gpub :$pb)"
}

# Sourced (slurm_pod_cluster.sh reuses the helpers above): define only.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0

case "${1:-}" in
  start) [ $# = 3 ] || die "usage: $0 start DIR GPULET"; start "$(cd "$2" && pwd)" "$3" ;;
  stop) [ $# = 2 ] || die "usage: $0 stop DIR"; stop "$(cd "$2" && pwd)" ;;
  *) die "usage: $0 start DIR GPULET | stop DIR" ;;
esac
