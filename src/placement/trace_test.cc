#include "placement/trace.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "placement/fragmentation.h"
#include "support/require.h"

namespace gpulet::placement {
namespace {

class TraceFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "gpulet-trace-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& content) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << content;
    return path;
  }
  std::string dir_;
};

TEST_F(TraceFiles, LoadsGpuNodesAndPodsWithModelConstraints) {
  const std::string nodes = Write("nodes.csv",
                                  "sn,cpu_milli,memory_mib,gpu,model\n"
                                  "n0,64000,262144,2,P100\n"
                                  "cpu0,32000,65536,0,\n"
                                  "n1,96000,393216,8,G2\n");
  Result<Cluster> c = LoadNodes(nodes);
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_EQ(c->nodes.size(), 2U);  // the CPU-only node is left out
  EXPECT_EQ(c->models, (std::vector<std::string>{"P100", "G2"}));
  EXPECT_EQ(c->nodes[1].gpu_free, std::vector<int32_t>(8, 1000));
  EXPECT_EQ(c->nodes[1].cpu_free, 96000);
  EXPECT_EQ(c->GpuCapacityMilli(), 10000);
  Result<Cluster> all = LoadNodes(nodes, {.gpu_nodes_only = false});
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->nodes.size(), 3U);
  EXPECT_EQ(all->nodes[1].model, -1);

  const std::string pods =
      Write("pods.csv",
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
            "deletion_time,scheduled_time\n"
            "p0,12000,16384,1,1000,,LS,Running,0,12537496,0\n"
            "p1,6000,12288,1,460,G2|V100M16,LS,Running,427061,12902960,427061\n"
            "p2,4000,8192,0,0,,BE,Running,1,2,\n"
            "p3,4000,8192,2,1000,A100,BE,Running,1,2,\n");
  Result<std::vector<Pod>> p = LoadPods(pods, *c);
  ASSERT_TRUE(p.ok()) << p.status().message();
  ASSERT_EQ(p->size(), 4U);
  EXPECT_EQ((*p)[0].num_gpu, 1);
  EXPECT_EQ((*p)[0].gpu_milli, 1000);
  EXPECT_FALSE((*p)[0].model_constrained);
  EXPECT_TRUE((*p)[1].IsSharing());
  EXPECT_TRUE((*p)[1].model_constrained);
  EXPECT_EQ((*p)[1].model_mask, uint64_t{0b10});  // G2 known, V100M16 absent
  EXPECT_EQ((*p)[2].num_gpu, 0);
  EXPECT_TRUE((*p)[3].model_constrained);
  EXPECT_EQ((*p)[3].model_mask, 0U);  // fits nowhere
}

TEST_F(TraceFiles, FiveColumnPodListsLoad) {
  Cluster c;
  const std::string pods = Write("pods.csv",
                                 "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
                                 "p0,12000,16384,8,1000\n");
  Result<std::vector<Pod>> p = LoadPods(pods, c);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ((*p)[0].num_gpu, 8);
}

TEST_F(TraceFiles, ErrorsNameFileLineAndColumn) {
  Cluster c;
  const std::string bad = Write("bad.csv",
                                "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
                                "p0,12000,16384,1,1000\n"
                                "p1,12000,lots,1,1000\n");
  Result<std::vector<Pod>> p = LoadPods(bad, c);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), ErrorCode::kInvalidInput);
  EXPECT_NE(p.status().message().find("bad.csv:3: memory_mib"), std::string::npos)
      << p.status().message();
  const std::string range = Write("range.csv",
                                  "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
                                  "p0,12000,16384,1,1500\n");
  p = LoadPods(range, c);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("range.csv:2: gpu_milli"), std::string::npos)
      << p.status().message();
  const std::string missing = Write("missing.csv", "name,cpu_milli\np0,1\n");
  p = LoadPods(missing, c);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("missing column 'memory_mib'"), std::string::npos);
  EXPECT_EQ(LoadPods(dir_ + "/none.csv", c).status().code(), ErrorCode::kNotFound);
}

// The published trace, where this workspace has it (../shared/traces/alibaba-openb beside the
// repository); never copied into the repository.
std::string TraceDir() {
  return std::string(GPULET_SOURCE_DIR) + "/../shared/traces/alibaba-openb";
}

TEST(OpenbTrace, AllVariantsLoad) {
  GPULET_REQUIRE_SHARED(GpuNodeListPath(TraceDir()));
  Result<Cluster> c = LoadNodes(GpuNodeListPath(TraceDir()));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->nodes.size(), 1213U);
  EXPECT_EQ(c->GpuCapacityMilli(), 6212 * 1000);
  for (const char* variant :
       {"default",    "cpu0",       "cpu037",      "cpu050",     "cpu072",     "cpu100",
        "cpu200",     "cpu235",     "cpu250",      "cpu300",     "gpushare20", "gpushare40",
        "gpushare60", "gpushare80", "gpushare100", "gpuspec05",  "gpuspec10",  "gpuspec20",
        "gpuspec25",  "gpuspec33",  "multigpu20",  "multigpu30", "multigpu40", "multigpu50"}) {
    Result<std::vector<Pod>> p = LoadPods(TraceVariantPath(TraceDir(), variant), *c);
    ASSERT_TRUE(p.ok()) << variant << ": " << p.status().message();
    EXPECT_GT(p->size(), 7000U) << variant;
  }
  Result<std::vector<Pod>> def = LoadPods(TraceVariantPath(TraceDir(), "default"), *c);
  ASSERT_TRUE(def.ok());
  EXPECT_EQ(def->size(), 8152U);
  // The paper's typical pods: the most frequent shapes up to 95 % of the pods.
  TypicalPods t = TypicalPods::FromWorkload(*def);
  EXPECT_EQ(t.pods().size(), 35U);
}

}  // namespace
}  // namespace gpulet::placement
