// `gpulet node`: plugin and exporter in one process, seen by the kubelet harness and by a scrape.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "run_command.h"

namespace gpulet::testing {
namespace {

std::string MakeDir() {
  std::string dir = ::testing::TempDir() + "gpulet-node-XXXXXX";
  return mkdtemp(dir.data()) != nullptr ? dir : "";
}

// `gpulet node` binds 127.0.0.1:0 and logs the port the kernel gave it; port() in the scripts reads
// the latest "event=listening" line (the exporter binds again when it restarts). A port chosen
// here and closed again could be taken by another process before the node binds it.
constexpr const char* kPortFunction =
    "port() { sed -n 's/.*event=listening .* port=\\([0-9]*\\).*/\\1/p' $D/node.log | tail -1; }; ";

// Writes `script` to DIR/run.sh and runs it with bash (the scripts start and stop gpulet node).
CommandResult RunScript(const std::string& dir, const std::string& script) {
  const std::string path = dir + "/run.sh";
  FILE* f = fopen(path.c_str(), "w");
  if (f == nullptr) return CommandResult{};
  fputs(script.c_str(), f);
  fclose(f);
  return RunCommand("bash " + path);
}

TEST(NodeCommand, ServesTheKubeletAndMetricsFromOneProcess) {
  const std::string dir = MakeDir();
  ASSERT_FALSE(dir.empty());
  const std::string script =
      "set -u; D=" + dir + "; mkdir -p $D/dp; " + kPortFunction + GpuletBinary() +
      " --simulate dgx-h100 --sim-state $D/s node --device-plugin-path $D/dp -a 127.0.0.1:0" +
      " -c 500 >$D/node.log 2>&1 & P=$!; " + std::string(GPULET_BUILD_DIR) +
      "/bin/gpulet-kubelet-harness --dir $D/dp --expect 8 --allocate 2 --timeout 30; H=$?; "
      "n=0; for i in $(seq 1 100); do "
      "n=$(curl -s 127.0.0.1:$(port)/metrics | grep -c '^DCGM_FI_DEV_GPU_TEMP{'); [ \"$n\" = 8 ] "
      "&& break; sleep 0.2; done; "
      "echo series=$n; kill -TERM $P; wait $P; echo node_exit=$?; echo harness_exit=$H";
  CommandResult r = RunScript(dir, script);
  EXPECT_NE(r.output.find("result=ok resource=nvidia.com/gpu"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("series=8"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("node_exit=0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("harness_exit=0"), std::string::npos) << r.output;
}

// A MIG re-layout under a running node: the plugin's rescan finds it and the exporter's series
// follow (GPU 1 of dgx-a100 goes from 7 x 1g.5gb to 2 x 3g.20gb).
TEST(NodeCommand, ExporterFollowsAMigRelayoutWithoutRestart) {
  const std::string dir = MakeDir();
  ASSERT_FALSE(dir.empty());
  const std::string url = "127.0.0.1:$(port)/metrics";
  const std::string gpu1 = "grep -c '^DCGM_FI_DEV_FB_USED{gpu=\"1\",'";
  // After the re-layout the series must carry the new profile: a stale exporter whose old MIG
  // handles partly still resolve would show two series too, but labelled 1g.5gb.
  const std::string gpu1_big =
      "grep -c '^DCGM_FI_DEV_FB_USED{gpu=\"1\",.*GPU_I_PROFILE=\"3g.20gb\"'";
  const std::string script =
      "set -u; D=" + dir + "; mkdir -p $D/dp; " + kPortFunction +
      "printf 'version: v1\\nmig-configs:\\n  two-big:\\n    - devices: [1]\\n"
      "      mig-enabled: true\\n      mig-devices: {\"3g.20gb\": 2}\\n' > $D/mig.yaml; " +
      GpuletBinary() + " --simulate dgx-a100 --sim-state $D/s node --device-plugin-path $D/dp" +
      " --mig-strategy mixed --rescan-interval 300ms -a 127.0.0.1:0" +
      " -c 200 >$D/node.log 2>&1 & P=$!; "
      "n=0; for i in $(seq 1 150); do n=$(curl -s " +
      url + " | " + gpu1 + "); [ \"$n\" = 7 ] && break; sleep 0.2; done; echo before=$n; " +
      GpuletBinary() + " --simulate dgx-a100 --sim-state $D/s mig apply -f $D/mig.yaml -c two-big" +
      " >$D/apply.log 2>&1; echo apply_exit=$?; "
      "n=0; for i in $(seq 1 150); do n=$(curl -s " +
      url + " | " + gpu1_big +
      "); [ \"$n\" = 2 ] && break; sleep 0.2; done; echo after=$n; "
      "kill -TERM $P; wait $P; echo node_exit=$?; "
      // After the exit: the log may be buffered while the node runs.
      "grep -c event=node_exporter_restarted $D/node.log | sed 's/^/restarts=/'";
  CommandResult r = RunScript(dir, script);
  EXPECT_NE(r.output.find("before=7"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("apply_exit=0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("after=2"), std::string::npos) << r.output;
  // At least one replacement: a rescan may also catch the layout half-way through the apply.
  const size_t at = r.output.find("restarts=");
  ASSERT_NE(at, std::string::npos) << r.output;
  EXPECT_GE(std::atoi(r.output.c_str() + at + 9), 1) << r.output;
  EXPECT_NE(r.output.find("node_exit=0"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace gpulet::testing
