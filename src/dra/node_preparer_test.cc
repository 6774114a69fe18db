// The node preparer against the simulated driver (loaded through the real dlopen path) and a fake
// driver root (library files, soname links and device-node placeholders in a temp dir): the CDI
// spec's JSON exactly, memory-share limits through the device plugin's directory layout, dynamic
// MIG under the layout lock, opaque config, and all-or-nothing with injected faults.
#include "dra/node_preparer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "cudashim/region.h"
#include "dra/names.h"
#include "mig/driver.h"
#include "mig/layout_lock.h"
#include "sim/control.h"
#include "sim/sim_node.h"

namespace gpulet::dra {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kNode[] = "node-a";
constexpr char kLib[] = "/usr/lib/x86_64-linux-gnu";
constexpr int64_t kGiB = int64_t{1} << 30;

void Touch(const fs::path& p) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << "x";
}

json ReadJson(const std::string& path) {
  Result<std::string> text = ReadFileBounded(path);
  EXPECT_TRUE(text.ok()) << text.status().message();
  return text.ok() ? json::parse(*text) : json();
}

class FakeMps : public MpsControl {
 public:
  Result<MpsDaemonDirs> Start(const MpsRequest& request) override {
    started.push_back(request);
    return MpsDaemonDirs{"/run/gpulet/mps/" + request.claim_uid + "/pipe", "/run/gpulet/mps/shm"};
  }
  Status Stop(const std::string& claim_uid) override {
    stopped.push_back(claim_uid);
    return Status::Ok();
  }
  std::vector<MpsRequest> started;
  std::vector<std::string> stopped;
};

class NodePreparerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<gpu::testing::SimNode> node = gpu::testing::OpenSimNode("dgx-h100");
    ASSERT_TRUE(node.ok()) << node.status().message();
    node_ = std::move(node).value();
    Result<gpu::Inventory> inv = gpu::Discover(*node_.nvml, node_.options);
    ASSERT_TRUE(inv.ok()) << inv.status().message();
    inventory_ = *inv;
    tmp_ = gpu::testing::MakeTempDir();
    root_ = tmp_ + "/driver";
    const std::string v = inventory_.driver_version;
    ASSERT_EQ(v, "550.54.15");
    for (const char* lib : {"libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so"}) {
      Touch(root_ + kLib + "/" + lib + "." + v);
      fs::create_symlink(std::string(lib) + "." + v, root_ + kLib + "/" + lib + ".1");
    }
    // Another driver's leftover and an unversioned development link are not mounted.
    Touch(root_ + kLib + "/libcuda.so.535.104.05");
    fs::create_symlink("libcuda.so.1", root_ + kLib + "/libcuda.so");
    Touch(root_ + "/usr/bin/nvidia-smi");
    Touch(root_ + "/usr/bin/nvidia-debugdump");
    for (const char* n : {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}) Touch(root_ + "/dev/" + n);
    for (const gpu::Gpu& g : inventory_.gpus) Touch(root_ + g.device_path());
    // Every MIG capability minor the simulated driver may hand out.
    for (int i = 0; i < 8 * 135 + 3; ++i) {
      Touch(root_ + "/dev/nvidia-caps/nvidia-cap" + std::to_string(i));
    }
  }

  NodePreparerOptions Options() {
    NodePreparerOptions o;
    o.node_name = kNode;
    o.inventory = inventory_;
    o.nvml = node_.nvml;
    o.discover = node_.options;
    o.mig_lock_file = mig::LayoutLockPath(node_.node.state_dir);
    o.cdi_root = tmp_ + "/cdi";
    o.driver_root = root_;
    o.nvidia_spec_dirs = {};
    o.state_dir = tmp_ + "/state";
    o.cuda_library = "/opt/gpulet/lib/libgpulet-cuda.so";
    return o;
  }

  std::unique_ptr<Preparer> Make(NodePreparerOptions o) {
    Result<std::unique_ptr<Preparer>> p = MakeNodePreparer(std::move(o));
    EXPECT_TRUE(p.ok()) << p.status().message();
    return p.ok() ? std::move(p).value() : nullptr;
  }

  static Claim MakeClaim(const std::string& uid, std::vector<AllocatedDevice> devices) {
    Claim c;
    c.ref = {"team-a", "claim-1", uid};
    c.allocated = true;
    for (AllocatedDevice& d : devices) {
      d.driver = kDriverName;
      if (d.pool.empty()) d.pool = kNode;
    }
    c.devices = std::move(devices);
    c.reserved_for_uids = {"pod-1"};
    return c;
  }

  static AllocatedDevice Dev(const std::string& request, const std::string& device) {
    AllocatedDevice d;
    d.request = request;
    d.device = device;
    return d;
  }

  static AllocatedDevice Share(const std::string& request, unsigned gpu, int64_t bytes,
                               const std::string& share_id) {
    AllocatedDevice d = Dev(request, "gpu-" + std::to_string(gpu) + "-mem");
    d.share_id = share_id;
    d.consumed["memory"] = bytes;
    return d;
  }

  std::string SpecPath(const std::string& uid) const {
    return tmp_ + "/cdi/gpu.gpulet.io-claim_" + uid + ".json";
  }
  std::string LimitsDir(const std::string& uid) const { return tmp_ + "/state/limits/" + uid; }
  std::string RecordPath(const std::string& uid) const {
    return tmp_ + "/state/claims/" + uid + ".json";
  }

  std::vector<mig::GpuInstance> Instances(unsigned gpu, bool* enabled = nullptr) {
    Result<std::vector<mig::GpuState>> s = mig::ReadMigState(*node_.nvml);
    EXPECT_TRUE(s.ok()) << s.status().message();
    if (!s.ok()) return {};
    if (enabled) *enabled = (*s)[gpu].mig_enabled;
    return (*s)[gpu].instances;
  }

  // The spec-level edits for the fake driver root as the host sees it at `host`.
  json CommonEdits(const std::string& host) const {
    auto h = [&](const std::string& p) { return host == "/" ? p : host + p; };
    const json ro = {"ro", "nosuid", "nodev", "rbind", "rprivate"};
    const std::string lib = kLib;
    json nodes = json::array();
    for (const char* n : {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}) {
      json node = {{"path", n}};
      if (host != "/") node["hostPath"] = h(n);
      nodes.push_back(node);
    }
    json mounts = json::array();
    for (const char* l : {"libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so"}) {
      const std::string real = lib + "/" + l + ".550.54.15";
      mounts.push_back({{"hostPath", h(real)}, {"containerPath", real}, {"options", ro}});
      mounts.push_back(
          {{"hostPath", h(real)}, {"containerPath", lib + "/" + l + ".1"}, {"options", ro}});
    }
    for (const char* b : {"/usr/bin/nvidia-smi", "/usr/bin/nvidia-debugdump"}) {
      mounts.push_back({{"hostPath", h(b)}, {"containerPath", b}, {"options", ro}});
    }
    return {{"deviceNodes", nodes}, {"mounts", mounts}};
  }
  // The same with the claim's device list (GPULET_DRA_DEVICES) for `devices` "<device>=<UUID>,…".
  json CommonEdits(const std::string& host, const std::string& devices) const {
    json e = CommonEdits(host);
    e["env"] = {"GPULET_DRA_DEVICES=" + devices};
    return e;
  }

  gpu::testing::SimNode node_;
  gpu::Inventory inventory_;
  std::string tmp_;
  std::string root_;
};

constexpr char kUidLetter[] = "a3c1e2f0-1111-4222-8333-944455556666";
constexpr char kUidDigit[] = "0b1c2d3e-1111-4222-8333-944455556666";

TEST_F(NodePreparerTest, WholeGpuSpecIsExactlyTheDriversEditsAtTheLowestVersion) {
  NodePreparerOptions o = Options();
  o.host_driver_root = "/";  // the agent sees the host's root at driver_root
  auto p = Make(o);
  Result<PrepareResult> r = p->Prepare(MakeClaim(kUidLetter, {Dev("gpu", "gpu-1")}));
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->devices.size(), 1u);
  EXPECT_THAT(r->devices[0].requests, ElementsAre("gpu"));
  EXPECT_EQ(r->devices[0].pool, kNode);
  EXPECT_EQ(r->devices[0].device, "gpu-1");
  const std::string name = std::string(kUidLetter) + "-gpu-1";
  EXPECT_THAT(r->devices[0].cdi_device_ids, ElementsAre("gpu.gpulet.io/claim=" + name));

  const json want = {
      {"cdiVersion", "0.3.0"},  // no hostPath, names start with a letter
      {"kind", "gpu.gpulet.io/claim"},
      {"devices",
       {{{"name", name},
         {"containerEdits",
          {{"deviceNodes", {{{"path", inventory_.gpus[1].device_path()}}}}}}}}},
      {"containerEdits", CommonEdits("/", "gpu-1=" + inventory_.gpus[1].uuid)}};
  EXPECT_EQ(ReadJson(SpecPath(kUidLetter)), want) << ReadJson(SpecPath(kUidLetter)).dump(2);
  struct stat st {};
  ASSERT_EQ(::stat(SpecPath(kUidLetter).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
}

TEST_F(NodePreparerTest, HostPathsAndADigitFirstNameNeedVersion050) {
  auto p = Make(Options());
  Result<PrepareResult> r = p->Prepare(MakeClaim(kUidDigit, {Dev("gpu", "gpu-0")}));
  ASSERT_TRUE(r.ok()) << r.status().message();
  const json spec = ReadJson(SpecPath(kUidDigit));
  EXPECT_EQ(spec["cdiVersion"], "0.5.0");
  EXPECT_EQ(spec["devices"][0]["containerEdits"]["deviceNodes"][0],
            json({{"path", "/dev/nvidia0"}, {"hostPath", root_ + "/dev/nvidia0"}}));
  EXPECT_EQ(spec["containerEdits"], CommonEdits(root_, "gpu-0=" + inventory_.gpus[0].uuid));
}

TEST_F(NodePreparerTest, TheCdiHookRunsUpdateLdcacheOverTheLibraryDirectories) {
  Touch(root_ + "/usr/bin/nvidia-cdi-hook");
  NodePreparerOptions o = Options();
  o.host_driver_root = "/";
  auto p = Make(o);
  ASSERT_TRUE(p->Prepare(MakeClaim(kUidLetter, {Dev("gpu", "gpu-1")})).ok());
  const json spec = ReadJson(SpecPath(kUidLetter));
  EXPECT_EQ(spec["containerEdits"]["hooks"],
            json::array({{{"hookName", "createContainer"},
                          {"path", "/usr/bin/nvidia-cdi-hook"},
                          {"args", {"nvidia-cdi-hook", "update-ldcache", "--folder", kLib}}}}));
}

TEST_F(NodePreparerTest, UnprepareRemovesEverythingAndSucceedsWhenNothingIsLeft) {
  auto p = Make(Options());
  Claim c = MakeClaim(kUidLetter, {Dev("gpu", "gpu-2"), Share("mem", 3, 20 * kGiB, "")});
  c.devices[1].share_id = "5f5f5f5f-0000-4000-8000-000000000001";
  Result<PrepareResult> r = p->Prepare(c);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(fs::exists(SpecPath(kUidLetter)));
  EXPECT_TRUE(fs::exists(LimitsDir(kUidLetter)));
  EXPECT_TRUE(fs::exists(RecordPath(kUidLetter)));
  ASSERT_TRUE(p->Unprepare(c.ref, r->record_json).ok());
  EXPECT_FALSE(fs::exists(SpecPath(kUidLetter)));
  EXPECT_FALSE(fs::exists(LimitsDir(kUidLetter)));
  EXPECT_FALSE(fs::exists(RecordPath(kUidLetter)));
  // Again, and with no record at all (a claim this node never prepared).
  EXPECT_TRUE(p->Unprepare(c.ref, r->record_json).ok());
  EXPECT_TRUE(p->Unprepare({"team-a", "other", "ffffffff-0000-4000-8000-000000000000"}, "").ok());
}

TEST_F(NodePreparerTest, UnprepareWithoutTheRecordUsesTheClaimsOwnRecordOnDisk) {
  auto p = Make(Options());
  Claim c = MakeClaim(kUidLetter, {Share("mem", 3, 10 * kGiB, "")});
  ASSERT_TRUE(p->Prepare(c).ok());
  // The plugin lost the answer (killed before checkpointing): a fresh process, no record_json.
  auto restarted = Make(Options());
  ASSERT_TRUE(restarted->Unprepare(c.ref, "").ok());
  EXPECT_FALSE(fs::exists(SpecPath(kUidLetter)));
  EXPECT_FALSE(fs::exists(LimitsDir(kUidLetter)));
}

TEST_F(NodePreparerTest, PrepareIsIdempotentPerClaimUid) {
  auto p = Make(Options());
  Claim c = MakeClaim(kUidLetter, {Dev("gpu", "gpu-1"), Dev("mig", "gpu-4-mig-1g-10gb-2")});
  Result<PrepareResult> first = p->Prepare(c);
  ASSERT_TRUE(first.ok()) << first.status().message();
  struct stat before {};
  ASSERT_EQ(::stat(SpecPath(kUidLetter).c_str(), &before), 0);
  // Same process, then a restarted one: the same devices, nothing written or created again.
  auto restarted = Make(Options());
  for (Preparer* q : {p.get(), restarted.get()}) {
    Result<PrepareResult> again = q->Prepare(c);
    ASSERT_TRUE(again.ok()) << again.status().message();
    ASSERT_EQ(again->devices.size(), first->devices.size());
    for (size_t i = 0; i < first->devices.size(); ++i) {
      EXPECT_EQ(again->devices[i].cdi_device_ids, first->devices[i].cdi_device_ids);
    }
    EXPECT_EQ(again->record_json, first->record_json);
  }
  struct stat after {};
  ASSERT_EQ(::stat(SpecPath(kUidLetter).c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino);
  EXPECT_EQ(Instances(4).size(), 1u);
}

TEST_F(NodePreparerTest, AMemoryShareIsALimitKeyedByUuidInTheDevicePluginsLayout) {
  NodePreparerOptions o = Options();
  o.host_driver_root = "/";
  auto p = Make(o);
  // Two shares of GPU 3 and one of GPU 5 in one claim: one limits file, shares of a GPU added.
  Claim c = MakeClaim(kUidLetter, {Share("a", 3, 20 * kGiB, "11111111-0000-4000-8000-000000000001"),
                                   Share("b", 3, 4 * kGiB, "11111111-0000-4000-8000-000000000002"),
                                   Share("c", 5, 8 * kGiB, "11111111-0000-4000-8000-000000000003")});
  Result<PrepareResult> r = p->Prepare(c);
  ASSERT_TRUE(r.ok()) << r.status().message();

  cudashim::LimitsFile limits{};
  const std::string limits_path = LimitsDir(kUidLetter) + "/gpulet-cuda.limits";
  ASSERT_EQ(cudashim::ReadLimitsFile(limits_path, &limits), "");
  ASSERT_EQ(limits.gpu_count, 2u);
  EXPECT_EQ(std::string(limits.gpus[0].uuid), inventory_.gpus[3].uuid);
  EXPECT_EQ(limits.gpus[0].limit, uint64_t(24 * kGiB));
  EXPECT_EQ(std::string(limits.gpus[1].uuid), inventory_.gpus[5].uuid);
  EXPECT_EQ(limits.gpus[1].limit, uint64_t(8 * kGiB));
  EXPECT_EQ(limits.flags, 0u);
  EXPECT_TRUE(fs::exists(LimitsDir(kUidLetter) + "/cuda/memory.region"));

  const std::string dev0 = std::string(kUidLetter) + "-gpu-3-mem-11111111-0000-4000-8000-000000000001";
  ASSERT_EQ(r->devices.size(), 3u);
  EXPECT_THAT(r->devices[0].cdi_device_ids, ElementsAre("gpu.gpulet.io/claim=" + dev0));
  EXPECT_EQ(r->devices[0].share_id, "11111111-0000-4000-8000-000000000001");
  const json ro = {"ro", "nosuid", "nodev", "rbind", "rprivate"};
  const json rw = {"rw", "nosuid", "nodev", "rbind", "rprivate"};
  const std::string dir = LimitsDir(kUidLetter);
  const json want_edits = {
      {"env", {"GPULET_CUDA_DIR=/run/gpulet/cuda"}},
      {"deviceNodes", {{{"path", inventory_.gpus[3].device_path()}}}},
      {"mounts",
       {{{"hostPath", "/opt/gpulet/lib/libgpulet-cuda.so"},
         {"containerPath", "/usr/lib/gpulet/libgpulet-cuda.so"},
         {"options", ro}},
        {{"hostPath", dir + "/gpulet-cuda.limits"},
         {"containerPath", "/usr/lib/gpulet/gpulet-cuda.limits"},
         {"options", ro}},
        {{"hostPath", dir + "/cuda"}, {"containerPath", "/run/gpulet/cuda"}, {"options", rw}},
        {{"hostPath", tmp_ + "/state/limits/ld.so.preload"},
         {"containerPath", "/etc/ld.so.preload"},
         {"options", ro}}}}};
  const json spec = ReadJson(SpecPath(kUidLetter));
  ASSERT_EQ(spec["devices"].size(), 3u);
  EXPECT_EQ(spec["devices"][0]["name"], dev0);
  EXPECT_EQ(spec["devices"][0]["containerEdits"], want_edits) << spec.dump(2);

  // What the plugin writes to status.devices[].data.
  const std::vector<PreparedDevice>& status = r->devices;
  ASSERT_EQ(status.size(), 3u);
  EXPECT_EQ(status[0].device, "gpu-3-mem");
  EXPECT_EQ(json::parse(status[0].status_data),
            json({{"uuid", inventory_.gpus[3].uuid}, {"memoryLimit", 24 * kGiB}}));
}

TEST_F(NodePreparerTest, PassThroughIsCarriedIntoTheLimitsFile) {
  NodePreparerOptions o = Options();
  o.memory_passthrough = true;
  auto p = Make(o);
  ASSERT_TRUE(p->Prepare(MakeClaim(kUidLetter, {Share("a", 1, kGiB, "")})).ok());
  cudashim::LimitsFile limits{};
  ASSERT_EQ(cudashim::ReadLimitsFile(LimitsDir(kUidLetter) + "/gpulet-cuda.limits", &limits), "");
  EXPECT_EQ(limits.flags, cudashim::kLimitsPassthrough);
}

TEST_F(NodePreparerTest, ADynamicMigDeviceIsCreatedAtItsPlacementAndDestroyedAtUnprepare) {
  NodePreparerOptions o = Options();
  o.host_driver_root = "/";
  auto p = Make(o);
  bool enabled = true;
  ASSERT_TRUE(Instances(0, &enabled).empty());
  ASSERT_FALSE(enabled);
  Claim c = MakeClaim(kUidLetter, {Dev("mig", "gpu-0-mig-1g-10gb-3")});
  Result<PrepareResult> r = p->Prepare(c);
  ASSERT_TRUE(r.ok()) << r.status().message();
  std::vector<mig::GpuInstance> inst = Instances(0, &enabled);
  EXPECT_TRUE(enabled);
  ASSERT_EQ(inst.size(), 1u);
  EXPECT_EQ(inst[0].profile, "1g.10gb");
  EXPECT_EQ(inst[0].start, 3u);

  Result<gpu::Inventory> inv = gpu::Discover(*node_.nvml, node_.options);
  ASSERT_TRUE(inv.ok());
  ASSERT_EQ(inv->gpus[0].mig_devices.size(), 1u);
  const gpu::MigDevice& m = inv->gpus[0].mig_devices[0];
  ASSERT_FALSE(m.gi_cap_path.empty());
  const json spec = ReadJson(SpecPath(kUidLetter));
  EXPECT_EQ(spec["devices"][0]["name"], std::string(kUidLetter) + "-gpu-0-mig-1g-10gb-3");
  EXPECT_EQ(spec["devices"][0]["containerEdits"],
            json({{"deviceNodes",
                   {{{"path", "/dev/nvidia0"}}, {{"path", m.gi_cap_path}}, {{"path", m.ci_cap_path}}}}}));
  EXPECT_EQ(spec["containerEdits"], CommonEdits("/", "gpu-0-mig-1g-10gb-3=" + m.uuid));
  const std::vector<PreparedDevice>& status = r->devices;
  ASSERT_EQ(status.size(), 1u);
  EXPECT_EQ(json::parse(status[0].status_data),
            json({{"uuid", inventory_.gpus[0].uuid}, {"migUuid", m.uuid}}));

  // After a restart the instance is known as the claim's, not a static layout: the slice
  // builder's input loses it (a static instance beside it on GPU 1 stays).
  {
    Result<std::vector<mig::GpuState>> state = mig::ReadMigState(*node_.nvml);
    ASSERT_TRUE(state.ok());
    mig::GpuInstance foreign{"1g.10gb", 0, 9u, true};
    (*state)[1].instances.push_back(foreign);
    ASSERT_EQ((*state)[0].instances.size(), 1u);
    EXPECT_EQ(ForgetDraMadeMigInstances(o.state_dir, *state), 1u);
    EXPECT_TRUE((*state)[0].instances.empty());
    ASSERT_EQ((*state)[1].instances.size(), 1u);
    EXPECT_EQ((*state)[1].instances[0], foreign);
  }

  // Unprepared by a restarted agent from the record alone: the instance goes, and MIG mode with
  // it (this claim turned it on and nothing else is on the GPU).
  auto restarted = Make(o);
  ASSERT_TRUE(restarted->Unprepare(c.ref, r->record_json).ok());
  EXPECT_TRUE(Instances(0, &enabled).empty());
  EXPECT_FALSE(enabled);
}

TEST_F(NodePreparerTest, MigModeStaysOnWhileAnotherClaimHoldsAnInstance) {
  auto p = Make(Options());
  Claim a = MakeClaim(kUidLetter, {Dev("mig", "gpu-2-mig-3g-40gb-0")});
  Claim b = MakeClaim(kUidDigit, {Dev("mig", "gpu-2-mig-2g-20gb-4")});
  Result<PrepareResult> ra = p->Prepare(a);
  ASSERT_TRUE(ra.ok()) << ra.status().message();
  Result<PrepareResult> rb = p->Prepare(b);
  ASSERT_TRUE(rb.ok()) << rb.status().message();
  ASSERT_EQ(Instances(2).size(), 2u);
  ASSERT_TRUE(p->Unprepare(a.ref, ra->record_json).ok());
  bool enabled = false;
  std::vector<mig::GpuInstance> left = Instances(2, &enabled);
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].profile, "2g.20gb");
  EXPECT_TRUE(enabled);
  ASSERT_TRUE(p->Unprepare(b.ref, rb->record_json).ok());
  EXPECT_TRUE(Instances(2).empty());
}

TEST_F(NodePreparerTest, ASecondMigCreateThatFailsUndoesEverythingBefore) {
  auto p = Make(Options());
  Claim c = MakeClaim(kUidLetter, {Share("mem", 3, 10 * kGiB, ""), Dev("a", "gpu-0-mig-1g-10gb-0"),
                                   Dev("b", "gpu-0-mig-1g-10gb-1")});
  // Creates count GI, CI, GI, …: the second device's GPU instance fails.
  sim::ControlFile control(node_.node.state_dir);
  ASSERT_TRUE(control.Update([](sim::ControlState& s) { s.mig_create_fail_countdown = 3; }).ok());
  Result<PrepareResult> r = p->Prepare(c);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("ResourceClaim team-a/claim-1 (" + std::string(kUidLetter)));
  EXPECT_THAT(r.status().message(), HasSubstr("creating 1g.10gb at memory slice 1"));
  EXPECT_THAT(r.status().message(), HasSubstr("everything prepared for the claim was undone"));
  bool enabled = true;
  EXPECT_TRUE(Instances(0, &enabled).empty());
  EXPECT_FALSE(enabled);
  EXPECT_FALSE(fs::exists(SpecPath(kUidLetter)));
  EXPECT_FALSE(fs::exists(LimitsDir(kUidLetter)));
  EXPECT_FALSE(fs::exists(RecordPath(kUidLetter)));
  // The fault is gone: the same claim prepares whole.
  Result<PrepareResult> again = p->Prepare(c);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(Instances(0).size(), 2u);
}

TEST_F(NodePreparerTest, ACdiWriteThatFailsUndoesTheMigDeviceAndTheLimits) {
  NodePreparerOptions o = Options();
  Touch(tmp_ + "/not-a-dir");
  o.cdi_root = tmp_ + "/not-a-dir";
  auto p = Make(o);
  Claim c = MakeClaim(kUidLetter, {Dev("mig", "gpu-1-mig-7g-80gb-0"), Share("mem", 3, kGiB, "")});
  Result<PrepareResult> r = p->Prepare(c);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("not-a-dir"));
  EXPECT_THAT(r.status().message(), HasSubstr("undone"));
  bool enabled = true;
  EXPECT_TRUE(Instances(1, &enabled).empty());
  EXPECT_FALSE(enabled);
  EXPECT_FALSE(fs::exists(LimitsDir(kUidLetter)));
  EXPECT_FALSE(fs::exists(RecordPath(kUidLetter)));
}

TEST_F(NodePreparerTest, AnInterruptedPrepareIsFoundFromItsJournal) {
  // A prepare killed after creating its MIG device, before it answered: the journal names the
  // placement (by its slug, as written before the create) and no GPU instance id.
  mig::Plan plan;
  Result<std::vector<mig::GpuState>> state = mig::ReadMigState(*node_.nvml);
  ASSERT_TRUE(state.ok());
  mig::GpuPlan gp;
  gp.index = 6;
  gp.name = (*state)[6].name;
  gp.mig_after = true;
  gp.create.push_back({"1g.10gb", 5, std::nullopt, true});
  plan.gpus.push_back(gp);
  ASSERT_TRUE(mig::ApplyPlan(*node_.nvml, plan).ok());
  const json journal = {
      {"version", 1},
      {"claim", {{"namespace", "team-a"}, {"name", "claim-1"}, {"uid", kUidLetter}}},
      {"complete", false},
      {"specFile", ""},
      {"limitsDir", false},
      {"mps", false},
      {"mig",
       {{{"gpu", 6}, {"gpuUuid", inventory_.gpus[6].uuid}, {"profile", "1g-10gb"}, {"start", 5},
         {"enabledMig", true}, {"migUuid", ""}}}},
      {"devices", json::array()}};
  fs::create_directories(tmp_ + "/state/claims");
  ASSERT_TRUE(WriteFileAtomic(RecordPath(kUidLetter), journal.dump()).ok());
  auto p = Make(Options());
  ASSERT_TRUE(p->Unprepare({"team-a", "claim-1", kUidLetter}, "").ok());
  bool enabled = true;
  EXPECT_TRUE(Instances(6, &enabled).empty());
  EXPECT_FALSE(enabled);
  EXPECT_FALSE(fs::exists(RecordPath(kUidLetter)));
}

TEST_F(NodePreparerTest, AnInterruptedPrepareIsRedoneNotReturned) {
  fs::create_directories(tmp_ + "/state/claims");
  const json journal = {
      {"version", 1},
      {"claim", {{"namespace", "team-a"}, {"name", "claim-1"}, {"uid", kUidLetter}}},
      {"complete", false}, {"specFile", ""}, {"limitsDir", false}, {"mps", false},
      {"mig", json::array()}, {"devices", json::array()}};
  ASSERT_TRUE(WriteFileAtomic(RecordPath(kUidLetter), journal.dump()).ok());
  auto p = Make(Options());
  Result<PrepareResult> r = p->Prepare(MakeClaim(kUidLetter, {Dev("gpu", "gpu-1")}));
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->devices.size(), 1u);
  EXPECT_TRUE(fs::exists(SpecPath(kUidLetter)));
}

TEST_F(NodePreparerTest, NvidiaCtksSpecIsReferredToInsteadOfOwnEdits) {
  const std::string etc = tmp_ + "/etc-cdi";
  fs::create_directories(etc);
  const std::string yaml = "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n  - name: \"" +
                           inventory_.gpus[4].uuid +
                           "\"\n    containerEdits: {deviceNodes: [{path: /dev/nvidia4}]}\n"
                           "  - name: \"5\"\n    containerEdits: {deviceNodes: [{path: /dev/nvidia5}]}\n"
                           "containerEdits: {env: [NVIDIA_VISIBLE_DEVICES=void]}\n";
  ASSERT_TRUE(WriteFileAtomic(etc + "/nvidia.yaml", yaml).ok());
  NodePreparerOptions o = Options();
  o.nvidia_spec_dirs = {etc};
  auto p = Make(o);
  Claim c = MakeClaim(kUidLetter, {Dev("a", "gpu-4"), Dev("b", "gpu-5")});
  Result<PrepareResult> r = p->Prepare(c);
  ASSERT_TRUE(r.ok()) << r.status().message();
  // Nothing of our own to add but the device list, in a device of its own.
  const std::string list = "gpu.gpulet.io/claim=" + std::string(kUidLetter) + "-devices";
  EXPECT_THAT(r->devices[0].cdi_device_ids,
              ElementsAre("nvidia.com/gpu=" + inventory_.gpus[4].uuid, list));
  EXPECT_THAT(r->devices[1].cdi_device_ids, ElementsAre("nvidia.com/gpu=5", list));
  const json only = ReadJson(SpecPath(kUidLetter));
  EXPECT_FALSE(only.contains("containerEdits"));
  ASSERT_EQ(only["devices"].size(), 1u);
  EXPECT_EQ(only["devices"][0]["containerEdits"],
            json({{"env", {"GPULET_DRA_DEVICES=gpu-4=" + inventory_.gpus[4].uuid + ",gpu-5=" +
                               inventory_.gpus[5].uuid}}}));

  // A memory share: nvidia-ctk's device plus ours with only the limit.
  Claim s = MakeClaim(kUidDigit, {Share("m", 4, kGiB, "")});
  Result<PrepareResult> rs = p->Prepare(s);
  ASSERT_TRUE(rs.ok()) << rs.status().message();
  EXPECT_THAT(rs->devices[0].cdi_device_ids,
              ElementsAre("nvidia.com/gpu=" + inventory_.gpus[4].uuid,
                          "gpu.gpulet.io/claim=" + std::string(kUidDigit) + "-gpu-4-mem"));
  const json spec = ReadJson(SpecPath(kUidDigit));
  EXPECT_EQ(spec["containerEdits"],
            json({{"env", {"GPULET_DRA_DEVICES=gpu-4-mem=" + inventory_.gpus[4].uuid}}}));
  EXPECT_FALSE(spec["devices"][0]["containerEdits"].contains("deviceNodes"));
  EXPECT_EQ(spec["devices"][0]["containerEdits"]["mounts"].size(), 4u);
}

TEST_F(NodePreparerTest, MpsConfigStartsADaemonPerClaimAndMountsItsPipe) {
  auto mps = std::make_shared<FakeMps>();
  NodePreparerOptions o = Options();
  o.mps = mps;
  auto p = Make(o);
  Claim c = MakeClaim(kUidLetter, {Dev("gpu", "gpu-2"), Dev("other", "gpu-3")});
  OpaqueConfig cfg;
  cfg.driver = kDriverName;
  cfg.requests = {"gpu"};
  cfg.parameters_json = R"({"apiVersion":"resource.gpulet.io/v1","kind":"GpuConfig",
      "sharing":{"strategy":"MPS","mps":{"defaultActiveThreadPercentage":25,
      "defaultPinnedDeviceMemoryLimit":"10Gi"}}})";
  cfg.where = "ResourceClaim team-a/claim-1: spec.devices.config[0]";
  c.configs = {cfg};
  Result<PrepareResult> r = p->Prepare(c);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(mps->started.size(), 1u);
  EXPECT_EQ(mps->started[0].claim_uid, kUidLetter);
  EXPECT_THAT(mps->started[0].gpu_uuids, ElementsAre(inventory_.gpus[2].uuid));
  EXPECT_EQ(mps->started[0].active_thread_percentage, 25);
  EXPECT_EQ(mps->started[0].pinned_memory_bytes, uint64_t(10 * kGiB));
  const json spec = ReadJson(SpecPath(kUidLetter));
  const json& e = spec["devices"][0]["containerEdits"];
  EXPECT_EQ(e["env"], json({"CUDA_MPS_PIPE_DIRECTORY=/run/gpulet/mps/pipe"}));
  EXPECT_EQ(e["mounts"][0]["hostPath"], "/run/gpulet/mps/" + std::string(kUidLetter) + "/pipe");
  EXPECT_FALSE(spec["devices"][1]["containerEdits"].contains("env"));  // gpu-3: no config
  EXPECT_EQ(json::parse(r->devices.at(0).status_data)["sharing"], "MPS");
  ASSERT_TRUE(p->Unprepare(c.ref, r->record_json).ok());
  EXPECT_THAT(mps->stopped, ElementsAre(kUidLetter));
}

TEST_F(NodePreparerTest, RefusalsNameTheClaimTheDeviceAndTheCause) {
  NodePreparerOptions o = Options();
  o.cuda_library.clear();
  auto p = Make(o);
  struct Case {
    Claim claim;
    std::string want;
  };
  AllocatedDevice other_pool = Dev("gpu", "gpu-1");
  other_pool.pool = "node-b";
  AllocatedDevice no_memory = Dev("m", "gpu-1-mem");
  OpaqueConfig bad;
  bad.driver = kDriverName;
  bad.parameters_json = R"({"apiVersion":"resource.gpulet.io/v1","kind":"GpuConfig",
                            "sharing":{"strategy":"Spatial"}})";
  bad.where = "ResourceClaim team-a/claim-1: spec.devices.config[3]";
  Claim with_bad = MakeClaim(kUidLetter, {Dev("gpu", "gpu-1")});
  with_bad.configs = {bad};
  OpaqueConfig mps = bad;
  mps.parameters_json = R"({"apiVersion":"resource.gpulet.io/v1","kind":"GpuConfig",
                            "sharing":{"strategy":"MPS"}})";
  Claim with_mps = MakeClaim(kUidLetter, {Dev("gpu", "gpu-1")});
  with_mps.configs = {mps};
  std::vector<Case> cases = {
      {MakeClaim(kUidLetter, {other_pool}), "results[0] (gpu-1): pool node-b is not this node"},
      {MakeClaim(kUidLetter, {Dev("gpu", "gpu-99")}), "results[0] (gpu-99): no such GPU"},
      {MakeClaim(kUidLetter, {Dev("gpu", "tpu-0")}), "not a device this driver publishes"},
      {MakeClaim(kUidLetter, {no_memory}), "consumedCapacity.memory: missing"},
      {MakeClaim(kUidLetter, {Share("m", 1, kGiB, "")}), "memory shares need libgpulet-cuda"},
      {MakeClaim("../../etc", {Dev("gpu", "gpu-1")}), "metadata.uid: not a Kubernetes UID"},
      {MakeClaim(kUidLetter, {Dev("mig", "gpu-0-mig-9g-1gb-0")}), "no MIG profile named like"},
      {MakeClaim(kUidLetter, {Dev("mig", "gpu-0-mig-3g-40gb-2")}), "cannot start at memory slice 2"},
      {with_bad, "spec.devices.config[3]: parameters.sharing.strategy: must be TimeSlicing or MPS"},
      {with_mps, "this node runs no MPS control"},
  };
  for (const Case& k : cases) {
    Result<PrepareResult> r = p->Prepare(k.claim);
    ASSERT_FALSE(r.ok()) << k.want;
    EXPECT_THAT(r.status().message(), HasSubstr("ResourceClaim team-a/claim-1")) << k.want;
    EXPECT_THAT(r.status().message(), HasSubstr(k.want));
  }
  EXPECT_FALSE(fs::exists(tmp_ + "/cdi"));
  EXPECT_TRUE(Instances(0).empty());
}

TEST_F(NodePreparerTest, OptionsMustBeAbsolutePaths) {
  NodePreparerOptions o = Options();
  o.state_dir = "relative/state";
  Result<std::unique_ptr<Preparer>> p = MakeNodePreparer(o);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("state_dir: must be an absolute path"));
}

TEST_F(NodePreparerTest, AMissingDriverLibraryIsAnErrorNamingTheRoot) {
  fs::remove(root_ + kLib + "/libcuda.so.550.54.15");
  auto p = Make(Options());
  Result<PrepareResult> r = p->Prepare(MakeClaim(kUidLetter, {Dev("gpu", "gpu-1")}));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr(root_ + ": no libcuda.so.550.54.15"));
  EXPECT_FALSE(fs::exists(RecordPath(kUidLetter)));
}

}  // namespace
}  // namespace gpulet::dra
