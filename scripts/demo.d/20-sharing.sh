# Sourced by scripts/demo.sh: GPU sharing. A time-sliced DGX H100 (half its GPUs shared four ways,
# the other half dedicated) and a DGX A100 in mixed MIG mode, each seen through the kubelet
# harness. Uses $GPULET, $BUILD, $STATE and step() from demo.sh.
HARNESS="$BUILD/bin/gpulet-kubelet-harness"

# --- time-slicing, per GPU ---
TS_DP="$STATE/ts-plugins"
TS_SIM=(--simulate dgx-h100 --sim-state "$STATE/ts-node")
mkdir -p "$TS_DP"
cat >"$STATE/time-slicing.yaml" <<'YAML'
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      rename: gpu.shared      # GPUs 0-3: four pods each, as nvidia.com/gpu.shared
      devices: [0, 1, 2, 3]
      replicas: 4
YAML
step "Time-slicing on a simulated DGX H100: GPUs 0-3 shared four ways as nvidia.com/gpu.shared, GPUs 4-7 stay dedicated nvidia.com/gpu"
sed 's/^/    /' "$STATE/time-slicing.yaml"
"$GPULET" "${TS_SIM[@]}" plugin --device-plugin-path "$TS_DP" --config "$STATE/time-slicing.yaml" \
  --health-quiet-period 3s >"$STATE/ts-plugin.log" 2>&1 &
TS_PID=$!
echo "-- nvidia.com/gpu.shared: 16 replica IDs (<GPU UUID>::<n>); two replicas are spread over two GPUs (distributed policy):"
"$HARNESS" --dir "$TS_DP" --resource nvidia.com/gpu.shared --expect 16 --allocate 2 --timeout 20 |
  grep -E 'event=(registered|preferred|allocate)|NVIDIA_VISIBLE_DEVICES' || true
echo "-- nvidia.com/gpu: the 4 dedicated GPUs, side by side on their own socket:"
"$HARNESS" --dir "$TS_DP" --resource nvidia.com/gpu --expect 4 --timeout 20 |
  grep -E 'event=registered' || true
ls "$TS_DP"
kill "$TS_PID" 2>/dev/null || true
wait "$TS_PID" 2>/dev/null || true

# --- MIG, mixed strategy ---
MIG_DP="$STATE/mig-plugins"
MIG_SIM=(--simulate dgx-a100 --sim-state "$STATE/mig-node")
mkdir -p "$MIG_DP"
step "MIG (mixed strategy) on a simulated DGX A100: GPU 0 is 3g.20gb+2g.10gb+2x1g.5gb, GPU 1 is 7x1g.5gb, GPUs 2-7 whole"
"$GPULET" "${MIG_SIM[@]}" plugin --device-plugin-path "$MIG_DP" --mig-strategy mixed \
  --pass-device-specs >"$STATE/mig-plugin.log" 2>&1 &
MIG_PID=$!
echo "-- one resource per profile; a 1g.5gb pod gets a MIG UUID, its parent /dev/nvidiaN and its GI/CI capability nodes:"
"$HARNESS" --dir "$MIG_DP" --resource nvidia.com/mig-1g.5gb --expect 9 --allocate 1 --timeout 20 |
  grep -E 'event=(registered|allocate)|NVIDIA_VISIBLE_DEVICES|nvidia-cap|/dev/nvidia[0-9]' || true
echo "-- resources served:"
grep -oE 'event=plugin_serving resource=[^ ]+ socket=[^ ]+ devices=[0-9]+' "$STATE/mig-plugin.log" |
  sed -E 's/socket=[^ ]*\//socket=/'
kill "$MIG_PID" 2>/dev/null || true
wait "$MIG_PID" 2>/dev/null || true
echo "-- with migStrategy single the same node is refused with a clear error (and advertises nothing):"
"$GPULET" "${MIG_SIM[@]}" plugin --device-plugin-path "$MIG_DP" --mig-strategy single 2>&1 | head -n 1 || true
