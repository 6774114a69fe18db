#include "labels/labels.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace gpulet::labels {
namespace {

gpu::Inventory H100Node(unsigned count) {
  gpu::Inventory inv;
  inv.driver_version = "550.54.15";
  inv.cuda_version = "12.4";
  for (unsigned i = 0; i < count; ++i) {
    gpu::Gpu g;
    g.index = i;
    g.uuid = "GPU-" + std::to_string(i);
    g.name = "NVIDIA H100 80GB HBM3";
    g.memory_mib = 81559;
    g.cc_major = 9;
    g.cc_minor = 0;
    g.architecture = "hopper";
    g.mig_capable = true;
    inv.gpus.push_back(g);
  }
  return inv;
}

gpu::MigDevice Mig(unsigned parent, unsigned index, const std::string& profile, uint64_t mib,
                   unsigned sms, unsigned slices) {
  gpu::MigDevice m;
  m.parent_index = parent;
  m.mig_index = index;
  m.uuid = "MIG-" + std::to_string(parent) + "-" + std::to_string(index);
  m.profile = profile;
  m.memory_mib = mib;
  m.sm_count = sms;
  m.gi_slices = slices;
  m.ci_slices = slices;
  return m;
}

sharing::Plan PlanWith(const std::string& name, sharing::SharingKind kind, int replicas) {
  sharing::Plan plan;
  sharing::Resource r;
  r.name = name;
  r.sharing = kind;
  r.replicas = replicas;
  plan.resources.push_back(r);
  return plan;
}

TEST(NodeLabels, WholeGpusCarryGfdNames) {
  const Labels l = NodeLabels(
      H100Node(8), PlanWith("nvidia.com/gpu", sharing::SharingKind::kNone, 1), LabelOptions{});
  EXPECT_EQ(l.at("nvidia.com/gpu.product"), "NVIDIA-H100-80GB-HBM3");
  EXPECT_EQ(l.at("nvidia.com/gpu.memory"), "81559");
  EXPECT_EQ(l.at("nvidia.com/gpu.count"), "8");
  EXPECT_EQ(l.at("nvidia.com/gpu.replicas"), "1");
  EXPECT_EQ(l.at("nvidia.com/gpu.sharing-strategy"), "none");
  EXPECT_EQ(l.at("nvidia.com/gpu.compute.major"), "9");
  EXPECT_EQ(l.at("nvidia.com/gpu.compute.minor"), "0");
  EXPECT_EQ(l.at("nvidia.com/gpu.family"), "hopper");
  EXPECT_EQ(l.at("nvidia.com/mig.capable"), "true");
  EXPECT_EQ(l.count("nvidia.com/mig.strategy"), 0u);  // GFD omits it for strategy none
  EXPECT_EQ(l.at("nvidia.com/mps.capable"), "false");
  EXPECT_EQ(l.at("nvidia.com/gpu.mode"), "unknown");  // no PCI class known
  EXPECT_EQ(l.at("nvidia.com/cuda.driver-version.full"), "550.54.15");
  EXPECT_EQ(l.at("nvidia.com/cuda.driver-version.major"), "550");
  EXPECT_EQ(l.at("nvidia.com/cuda.driver-version.minor"), "54");
  EXPECT_EQ(l.at("nvidia.com/cuda.driver-version.revision"), "15");
  EXPECT_EQ(l.at("nvidia.com/cuda.driver.rev"), "15");
  EXPECT_EQ(l.at("nvidia.com/cuda.runtime-version.major"), "12");
  EXPECT_EQ(l.at("nvidia.com/cuda.runtime-version.minor"), "4");
  EXPECT_EQ(l.at("nvidia.com/cuda.runtime.minor"), "4");
  EXPECT_EQ(l.count("nvidia.com/gfd.timestamp"), 0u);
  EXPECT_EQ(l.at("nvidia.com/gpu.machine"), "unknown");  // GFD's value without a machine type
}

TEST(NodeLabels, TimeSlicedPlainResourceMarksProductShared) {
  const Labels l = NodeLabels(
      H100Node(2), PlanWith("nvidia.com/gpu", sharing::SharingKind::kTimeSlicing, 4), {});
  EXPECT_EQ(l.at("nvidia.com/gpu.product"), "NVIDIA-H100-80GB-HBM3-SHARED");
  EXPECT_EQ(l.at("nvidia.com/gpu.replicas"), "4");
  EXPECT_EQ(l.at("nvidia.com/gpu.sharing-strategy"), "time-slicing");
  EXPECT_EQ(l.at("nvidia.com/gpu.count"), "2");
}

TEST(NodeLabels, MemoryPoolNamesPoolAndUnit) {
  sharing::Plan plan = PlanWith("gpulet.io/gpu-memory-512mi", sharing::SharingKind::kMemory, 159);
  plan.resources[0].unit_bytes = uint64_t{512} << 20;
  Labels l = NodeLabels(H100Node(2), plan, {});
  EXPECT_EQ(l.at("gpulet.io/gpu-memory.pool"), "true");
  EXPECT_EQ(l.at("gpulet.io/gpu-memory.unit"), "512Mi");
  l = NodeLabels(H100Node(2), PlanWith("nvidia.com/gpu", sharing::SharingKind::kNone, 1), {});
  EXPECT_EQ(l.count("gpulet.io/gpu-memory.pool"), 0u);
  EXPECT_EQ(l.count("gpulet.io/gpu-memory.unit"), 0u);
}

// GFD reads replicas by the entry's original name: a renamed shared resource still says
// gpu.replicas=N, without -SHARED in the product.
TEST(NodeLabels, RenamedSharedResourceKeepsPlainProductAndReplicas) {
  sharing::Plan plan = PlanWith("nvidia.com/gpu.shared", sharing::SharingKind::kMps, 8);
  auto cfg = config::ParseConfig(
      "sharing: {mps: {resources: [{name: gpu, rename: gpu.shared, replicas: 8}]}}", "c.yaml");
  ASSERT_TRUE(cfg.ok()) << cfg.status().message();
  LabelOptions o;
  o.sharing = &cfg->sharing;
  const Labels l = NodeLabels(H100Node(2), plan, o);
  EXPECT_EQ(l.at("nvidia.com/gpu.product"), "NVIDIA-H100-80GB-HBM3");
  EXPECT_EQ(l.at("nvidia.com/gpu.replicas"), "8");
  EXPECT_EQ(l.at("nvidia.com/gpu.sharing-strategy"), "mps");
  EXPECT_EQ(l.at("nvidia.com/mps.capable"), "true");
  // renameByDefault counts as renamed too.
  cfg = config::ParseConfig(
      "sharing: {timeSlicing: {renameByDefault: true, resources: [{name: gpu, replicas: 3}]}}",
      "c.yaml");
  ASSERT_TRUE(cfg.ok()) << cfg.status().message();
  o.sharing = &cfg->sharing;
  const Labels t = NodeLabels(H100Node(2), plan, o);
  EXPECT_EQ(t.at("nvidia.com/gpu.product"), "NVIDIA-H100-80GB-HBM3");
  EXPECT_EQ(t.at("nvidia.com/gpu.replicas"), "3");
  EXPECT_EQ(t.at("nvidia.com/gpu.sharing-strategy"), "time-slicing");
  EXPECT_EQ(t.at("nvidia.com/mps.capable"), "false");
}

TEST(NodeLabels, FamilyNamesAsGfd) {
  EXPECT_EQ(ArchFamily(8, 0), "ampere");
  EXPECT_EQ(ArchFamily(8, 6), "ampere");
  EXPECT_EQ(ArchFamily(8, 9), "ada-lovelace");
  EXPECT_EQ(ArchFamily(9, 0), "hopper");
  EXPECT_EQ(ArchFamily(7, 0), "volta");
  EXPECT_EQ(ArchFamily(7, 5), "turing");
  EXPECT_EQ(ArchFamily(10, 0), "blackwell");
  EXPECT_EQ(ArchFamily(12, 0), "blackwell");
  EXPECT_EQ(ArchFamily(4, 0), "undefined");
  gpu::Inventory inv = H100Node(1);
  inv.gpus[0].name = "NVIDIA L4";
  inv.gpus[0].cc_major = 8;
  inv.gpus[0].cc_minor = 9;
  inv.gpus[0].architecture = "ada";
  EXPECT_EQ(NodeLabels(inv, {}, {}).at("nvidia.com/gpu.family"), "ada-lovelace");
}

TEST(NodeLabels, ProductSanitisedAsGfd) {
  EXPECT_EQ(SanitizeProduct("NVIDIA GeForce RTX 4090 (Laptop)"), "NVIDIA-GeForce-RTX-4090-Laptop");
  EXPECT_EQ(SanitizeProduct("  NVIDIA   A100-SXM4-40GB "), "NVIDIA-A100-SXM4-40GB");
  EXPECT_EQ(SanitizeProduct("Tesla T4/PCIe"), "Tesla-T4PCIe");
}

TEST(NodeLabels, ModeFromPciClass) {
  gpu::Inventory inv = H100Node(2);
  for (auto& g : inv.gpus) g.pci_class = 0x030200;
  EXPECT_EQ(NodeLabels(inv, {}, {}).at("nvidia.com/gpu.mode"), "compute");
  for (auto& g : inv.gpus) g.pci_class = 0x030000;
  EXPECT_EQ(NodeLabels(inv, {}, {}).at("nvidia.com/gpu.mode"), "graphics");
  inv.gpus[1].pci_class = 0x030200;
  EXPECT_EQ(NodeLabels(inv, {}, {}).at("nvidia.com/gpu.mode"), "unknown");
}

// mig-strategy=single with more than one profile: GFD's MIG-INVALID labels, not nothing.
TEST(NodeLabels, InvalidSingleWritesMigInvalid) {
  gpu::Inventory inv = H100Node(2);
  inv.gpus[0].mig_enabled = true;
  inv.gpus[0].mig_devices = {Mig(0, 0, "3g.40gb", 40192, 60, 3), Mig(0, 1, "1g.10gb", 9856, 16, 1)};
  inv.gpus[1].mig_enabled = true;
  inv.gpus[1].mig_devices = {Mig(1, 0, "3g.40gb", 40192, 60, 3)};
  LabelOptions o;
  o.mig_strategy = config::MigStrategy::kSingle;
  Labels l = NodeLabels(inv, {}, o);
  EXPECT_EQ(l.at("nvidia.com/gpu.product"), "NVIDIA-H100-80GB-HBM3-MIG-INVALID");
  EXPECT_EQ(l.at("nvidia.com/gpu.count"), "0");
  EXPECT_EQ(l.at("nvidia.com/gpu.replicas"), "0");
  EXPECT_EQ(l.at("nvidia.com/gpu.memory"), "0");
  EXPECT_EQ(l.at("nvidia.com/mig.strategy"), "single");
  // MIG on one GPU only (mixed with a whole GPU) is invalid too.
  inv.gpus[0].mig_devices.pop_back();
  inv.gpus[1].mig_enabled = false;
  inv.gpus[1].mig_devices.clear();
  l = NodeLabels(inv, {}, o);
  EXPECT_EQ(l.at("nvidia.com/gpu.product"), "NVIDIA-H100-80GB-HBM3-MIG-INVALID");
}

TEST(NodeLabels, MigSingleDescribesTheMigDevice) {
  gpu::Inventory inv = H100Node(2);
  for (gpu::Gpu& g : inv.gpus) {
    g.mig_enabled = true;
    for (unsigned i = 0; i < 7; ++i)
      g.mig_devices.push_back(Mig(g.index, i, "1g.10gb", 9856, 16, 1));
  }
  LabelOptions o;
  o.mig_strategy = config::MigStrategy::kSingle;
  const Labels l = NodeLabels(inv, PlanWith("nvidia.com/gpu", sharing::SharingKind::kNone, 1), o);
  EXPECT_EQ(l.at("nvidia.com/mig.strategy"), "single");
  EXPECT_EQ(l.at("nvidia.com/gpu.product"), "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb");
  EXPECT_EQ(l.at("nvidia.com/gpu.count"), "14");
  EXPECT_EQ(l.at("nvidia.com/gpu.memory"), "9856");
  EXPECT_EQ(l.at("nvidia.com/gpu.multiprocessors"), "16");
  EXPECT_EQ(l.at("nvidia.com/gpu.slices.gi"), "1");
  EXPECT_EQ(l.at("nvidia.com/gpu.slices.ci"), "1");
}

TEST(NodeLabels, MigMixedLabelsEveryProfile) {
  gpu::Inventory inv = H100Node(3);
  inv.gpus[0].mig_enabled = true;
  inv.gpus[0].mig_devices = {Mig(0, 0, "3g.40gb", 40192, 60, 3),
                             Mig(0, 1, "1g.10gb+me", 9856, 16, 1),
                             Mig(0, 2, "1g.10gb", 9856, 16, 1)};
  inv.gpus[1].mig_enabled = true;
  inv.gpus[1].mig_devices = {Mig(1, 0, "3g.40gb", 40192, 60, 3)};
  LabelOptions o;
  o.mig_strategy = config::MigStrategy::kMixed;
  const Labels l = NodeLabels(inv, PlanWith("nvidia.com/gpu", sharing::SharingKind::kNone, 1), o);
  EXPECT_EQ(l.at("nvidia.com/mig.strategy"), "mixed");
  EXPECT_EQ(l.at("nvidia.com/mig-3g.40gb.count"), "2");
  EXPECT_EQ(l.at("nvidia.com/mig-3g.40gb.memory"), "40192");
  EXPECT_EQ(l.at("nvidia.com/mig-3g.40gb.multiprocessors"), "60");
  EXPECT_EQ(l.at("nvidia.com/mig-3g.40gb.slices.gi"), "3");
  EXPECT_EQ(l.at("nvidia.com/mig-3g.40gb.product"), "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb");
  EXPECT_EQ(l.at("nvidia.com/mig-3g.40gb.replicas"), "1");
  EXPECT_EQ(l.at("nvidia.com/mig-3g.40gb.sharing-strategy"), "none");
  EXPECT_EQ(l.at("nvidia.com/mig-3g.40gb.engines.copy"), "0");
  EXPECT_EQ(l.at("nvidia.com/mig-1g.10gb.me.count"), "1");
  EXPECT_EQ(l.at("nvidia.com/mig-1g.10gb.count"), "1");
  // The whole-GPU labels still describe the physical GPUs.
  EXPECT_EQ(l.at("nvidia.com/gpu.count"), "3");
  EXPECT_EQ(l.at("nvidia.com/gpu.product"), "NVIDIA-H100-80GB-HBM3");
}

TEST(NodeLabels, NotMigCapableHasNoStrategyAndOptionalLabels) {
  gpu::Inventory inv = H100Node(1);
  inv.gpus[0].mig_capable = false;
  inv.gpus[0].name = "NVIDIA L4";
  inv.gpus[0].architecture = "ada";
  LabelOptions o;
  o.machine = "PowerEdge R760xa (Dell)";
  o.timestamp = 1700000000;
  const Labels l = NodeLabels(inv, PlanWith("nvidia.com/gpu", sharing::SharingKind::kNone, 1), o);
  EXPECT_EQ(l.at("nvidia.com/mig.capable"), "false");
  EXPECT_EQ(l.count("nvidia.com/mig.strategy"), 0u);
  EXPECT_EQ(l.at("nvidia.com/gpu.product"), "NVIDIA-L4");
  EXPECT_EQ(l.at("nvidia.com/gpu.machine"), "PowerEdge-R760xa--Dell");
  EXPECT_EQ(l.at("nvidia.com/gfd.timestamp"), "1700000000");
}

TEST(NodeLabels, NoGpusNoLabels) {
  EXPECT_TRUE(NodeLabels(gpu::Inventory{}, sharing::Plan{}, {}).empty());
}

TEST(SanitizeValue, ProducesValidLabelValues) {
  EXPECT_EQ(SanitizeValue("NVIDIA A100-SXM4-40GB"), "NVIDIA-A100-SXM4-40GB");
  EXPECT_EQ(SanitizeValue("  (weird) name!"), "weird--name");
  EXPECT_EQ(SanitizeValue(std::string(100, 'a')).size(), 63u);
  EXPECT_EQ(SanitizeValue("a" + std::string(62, 'b') + "-c"), "a" + std::string(62, 'b'));
  EXPECT_EQ(SanitizeValue("---"), "");
}

class FeatureFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpulet-labels-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }
  std::string dir_;
};

TEST_F(FeatureFileTest, WritesSortedKeyValueLinesAndReplacesAtomically) {
  const std::string path = dir_ + "/gfd";
  ASSERT_TRUE(WriteFeatureFile(path, {{"nvidia.com/gpu.count", "8"}, {"nvidia.com/a", "x"}}).ok());
  ASSERT_TRUE(WriteFeatureFile(path, {{"nvidia.com/gpu.count", "4"}}).ok());
  std::ifstream in(path);
  std::stringstream body;
  body << in.rdbuf();
  EXPECT_EQ(body.str(), "nvidia.com/gpu.count=4\n");
  EXPECT_EQ(FeatureFile({{"b", "2"}, {"a", "1"}}), "a=1\nb=2\n");
  // No temporary file is left behind.
  EXPECT_NE(access((path + ".tmp." + std::to_string(getpid())).c_str(), F_OK), 0);
}

TEST_F(FeatureFileTest, MissingDirectoryIsNotFound) {
  const Status s = WriteFeatureFile(dir_ + "/nope/gfd", {{"a", "b"}});
  EXPECT_EQ(s.code(), ErrorCode::kNotFound);
  EXPECT_NE(s.message().find(dir_ + "/nope"), std::string::npos);
}

TEST_F(FeatureFileTest, MachineTypeFromDmi) {
  const std::string path = dir_ + "/product_name";
  std::ofstream(path) << "DGX H100\n";
  EXPECT_EQ(ReadMachineType(path), "DGX-H100");
  EXPECT_EQ(ReadMachineType(dir_ + "/missing"), "");
}

}  // namespace
}  // namespace gpulet::labels
