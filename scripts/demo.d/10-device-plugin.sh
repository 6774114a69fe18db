# Sourced by scripts/demo.sh: the device plugin on a simulated DGX H100, seen through the kubelet
# harness. Uses $GPULET, $BUILD, $STATE and step() from demo.sh.
HARNESS="$BUILD/bin/gpulet-kubelet-harness"
DP="$STATE/device-plugins"
SIM=(--simulate dgx-h100 --sim-state "$STATE/dp-node")
mkdir -p "$DP"

step "gpulet plugin on a simulated DGX H100 (the kubelet is not there yet: the plugin waits for it)"
"$GPULET" "${SIM[@]}" plugin --device-plugin-path "$DP" --health-quiet-period 3s \
  >"$STATE/plugin.log" 2>&1 &
PLUGIN_PID=$!
sleep 1

step "The kubelet harness registers nvidia.com/gpu: 8 and asks for a 2-GPU preferred allocation (NVLink-aware), then allocates it"
"$HARNESS" --dir "$DP" --expect 8 --allocate 2 --timeout 20

step "A kubelet watching the stream; XID 79 (GPU fell off the bus) is injected on GPU 3"
"$HARNESS" --dir "$DP" --watch --duration 9 >"$STATE/watch.log" 2>&1 &
WATCH_PID=$!
sleep 2
"$GPULET" "${SIM[@]}" sim xid --gpu 3 --code 79
sleep 1
echo "-- the harness sees GPU 3 Unhealthy, the other 7 stay Healthy:"
grep -E 'event=devices' "$STATE/watch.log" | tail -n 1 | grep -oE 'total=[0-9]+ healthy=[0-9]+|GPU-[^,:]+:Unhealthy' || true
echo "-- after the quiet period (3 s here) with no new critical event, GPU 3 is advertised Healthy again:"
wait "$WATCH_PID" || true
grep -E 'event=devices' "$STATE/watch.log" | tail -n 1 | grep -oE 'total=[0-9]+ healthy=[0-9]+'
kill "$PLUGIN_PID" 2>/dev/null || true
wait "$PLUGIN_PID" 2>/dev/null || true
echo "-- plugin log (first lines):"
head -n 8 "$STATE/plugin.log"
