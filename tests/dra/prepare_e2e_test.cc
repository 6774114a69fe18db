// End to end for a DRA memory share: the node preparer prepares a claim for a 20 GiB share of a
// simulated H200, then the probe runs in a "container" made from the claim's CDI spec alone: a
// private mount namespace (unshare -m; /usr, /etc and /run are overlays or tmpfs there, so the
// host is never touched) with every mount of the spec (the driver's files from a fake driver root,
// the library, the read-only limits file, the region directory, /etc/ld.so.preload) and exactly
// the spec's environment; no LD_PRELOAD. The process gets its share and not a byte more.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/files.h"
#include "common/process.h"
#include "cudashim/region.h"
#include "dra/names.h"
#include "dra/node_preparer.h"
#include "mig/layout_lock.h"
#include "sim/fixture.h"
#include "sim/sim_node.h"
#include "support/build_dir.h"
#include "support/require.h"

namespace gpulet::dra {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using gpulet::testing::BuildDir;
using gpulet::testing::ShellQuote;

constexpr uint64_t kMiB = 1024ULL * 1024ULL;
constexpr uint64_t kGiB = 1024 * kMiB;

void Touch(const fs::path& p) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << "x";
}

TEST(DraPrepareE2E, AMemoryShareHoldsInAContainerMadeFromTheCdiSpec) {
  GPULET_REQUIRE_ROOT("a private mount namespace");
  Result<gpu::testing::SimNode> node = gpu::testing::OpenSimNode("hgx-h200");
  ASSERT_TRUE(node.ok()) << node.status().message();
  Result<gpu::Inventory> inv = gpu::Discover(*node->nvml, node->options);
  ASSERT_TRUE(inv.ok()) << inv.status().message();
  const std::string tmp = gpu::testing::MakeTempDir();
  const std::string root = tmp + "/driver";
  const std::string lib = root + "/usr/lib/x86_64-linux-gnu/";
  for (const char* l : {"libcuda.so", "libnvidia-ml.so"}) {
    Touch(lib + l + "." + inv->driver_version);
    fs::create_symlink(std::string(l) + "." + inv->driver_version, lib + l + ".1");
  }
  Touch(root + "/usr/bin/nvidia-smi");
  Touch(root + "/dev/nvidiactl");
  for (const gpu::Gpu& g : inv->gpus) Touch(root + g.device_path());

  // The node names the driver the library calls (written into the limits file the CDI spec
  // mounts): the simulated one. The container's LD_LIBRARY_PATH below no longer picks it (issue 36).
  struct NodeDriver {
    NodeDriver() {
      ::setenv("GPULET_CONTAINER_CUDA_DRIVER", (BuildDir() + "/cuda_sim/libcuda.so.1").c_str(), 1);
    }
    ~NodeDriver() { ::unsetenv("GPULET_CONTAINER_CUDA_DRIVER"); }
  } node_driver;
  NodePreparerOptions o;
  o.node_name = "node-a";
  o.inventory = *inv;
  o.nvml = node->nvml;
  o.discover = node->options;
  o.mig_lock_file = mig::LayoutLockPath(node->node.state_dir);
  o.cdi_root = tmp + "/cdi";
  o.driver_root = root;
  o.nvidia_spec_dirs = {};
  o.state_dir = tmp + "/state";
  o.cuda_library = BuildDir() + "/lib/libgpulet-cuda.so";
  Result<std::unique_ptr<Preparer>> preparer = MakeNodePreparer(o);
  ASSERT_TRUE(preparer.ok()) << preparer.status().message();

  Claim claim;
  claim.ref = {"team-a", "share", "c0ffee00-0000-4000-8000-000000000001"};
  claim.allocated = true;
  AllocatedDevice share;
  share.request = "memory";
  share.driver = kDriverName;
  share.pool = "node-a";
  share.device = "gpu-0-mem";
  share.share_id = "5eed0000-0000-4000-8000-000000000001";
  const uint64_t limit = 20 * kGiB;
  share.consumed["memory"] = static_cast<int64_t>(limit);
  claim.devices = {share};
  Result<PrepareResult> prepared = (*preparer)->Prepare(claim);
  ASSERT_TRUE(prepared.ok()) << prepared.status().message();
  ASSERT_EQ(prepared->devices.size(), 1u);
  ASSERT_EQ(prepared->devices[0].cdi_device_ids.size(), 1u);

  // The container runtime's part: the spec's edits for the device asked for, and the spec's own.
  Result<std::string> text =
      ReadFileBounded(o.cdi_root + "/gpu.gpulet.io-claim_" + claim.ref.uid + ".json");
  ASSERT_TRUE(text.ok()) << text.status().message();
  const json spec = json::parse(*text);
  const std::string id = prepared->devices[0].cdi_device_ids[0];
  const std::string name = id.substr(id.find('=') + 1);
  json mounts = json::array(), env = json::array();
  for (const json& edits : {spec.value("containerEdits", json::object()),
                            spec["devices"][0]["containerEdits"]}) {
    for (const json& m : edits.value("mounts", json::array())) mounts.push_back(m);
    for (const json& e : edits.value("env", json::array())) env.push_back(e);
  }
  ASSERT_EQ(spec["devices"][0]["name"], name);
  std::string region_dir, limits_file;
  for (const json& m : mounts) {
    if (m["containerPath"] == "/run/gpulet/cuda") region_dir = m["hostPath"];
    if (m["containerPath"] == "/usr/lib/gpulet/gpulet-cuda.limits") limits_file = m["hostPath"];
  }
  ASSERT_FALSE(region_dir.empty());
  ASSERT_FALSE(limits_file.empty());
  cudashim::Region region;
  ASSERT_EQ(region.Open(region_dir, /*read_only=*/true), "");
  ASSERT_EQ(region.LoadLimits(limits_file), "");
  ASSERT_EQ(region.Usage().size(), 1u);
  EXPECT_EQ(region.Usage()[0].uuid, inv->gpus[0].uuid);
  EXPECT_EQ(region.Usage()[0].limit, limit);

  const std::string ovl = tmp + "/ovl";
  for (const char* d : {"uu", "uw", "eu", "ew"}) fs::create_directories(ovl + "/" + d);
  std::ostringstream sh;
  sh << "set -e\n"
     << "mount -t overlay overlay -o lowerdir=/usr,upperdir=" << ovl << "/uu,workdir=" << ovl
     << "/uw /usr\n"
     << "mount -t overlay overlay -o lowerdir=/etc,upperdir=" << ovl << "/eu,workdir=" << ovl
     << "/ew /etc\n"
     << "mount -t tmpfs tmpfs /run\n";
  for (const json& m : mounts) {
    const std::string c = ShellQuote(m["containerPath"]), h = ShellQuote(m["hostPath"]);
    bool ro = false;
    for (const json& opt : m.value("options", json::array())) ro = ro || opt == "ro";
    sh << "mkdir -p \"$(dirname " << c << ")\"\n"
       << "if [ -d " << h << " ]; then mkdir -p " << c << "; else touch " << c << "; fi\n"
       << "mount --bind " << h << " " << c << "\n";
    if (ro) sh << "mount -o remount,bind,ro " << c << "\n";
  }
  auto fixture = sim::LoadFixture(node->node.fixture_path);
  ASSERT_TRUE(fixture.ok()) << fixture.status().message();
  sh << "exec env -i";
  for (const json& e : env) sh << " " << ShellQuote(e.get<std::string>());
  sh << " " << ShellQuote("LD_LIBRARY_PATH=" + BuildDir() + "/sim:" + BuildDir() + "/cuda_sim") << " "
     << ShellQuote("GPULET_SIM_FIXTURE=" + fixture->path)
     << " GPULET_CUDA_SIM_CONTEXT_BYTES=" << 512 * kMiB << " "
     << ShellQuote(BuildDir() + "/bin/memlimit_probe") << " --via link init fill alloc " << kGiB
     << " info\n";
  CommandSpec cmd;
  cmd.argv = {"unshare", "-m", "--propagation", "private", "sh", "-c", sh.str()};
  cmd.timeout = std::chrono::seconds(120);
  auto out = RunCommand(cmd);
  ASSERT_TRUE(out.ok()) << out.status().message();
  ASSERT_EQ(out->exit_code, 0) << out->out << out->err;
  EXPECT_NE(out->out.find("init rc=0"), std::string::npos) << out->out << out->err;
  EXPECT_NE(out->out.find("last_rc=2"), std::string::npos) << out->out;  // OUT_OF_MEMORY
  // 512 MiB context + 1 GiB chunks: everything that fits in the share, and not a byte more.
  const uint64_t fits = (limit - 512 * kMiB) / kGiB * kGiB;
  EXPECT_NE(out->out.find("admitted=" + std::to_string(fits) + " "), std::string::npos)
      << out->out;
  EXPECT_NE(out->out.find("cu_total=" + std::to_string(limit) + " "), std::string::npos)
      << out->out;
  EXPECT_EQ(region.Usage()[0].peak, fits + 512 * kMiB);

  ASSERT_TRUE((*preparer)->Unprepare(claim.ref, prepared->record_json).ok());
  EXPECT_FALSE(fs::exists(region_dir));
}

}  // namespace
}  // namespace gpulet::dra
