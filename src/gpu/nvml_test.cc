#include "gpu/nvml.h"

#include <gtest/gtest.h>

#include <fstream>

#include "sim/sim_node.h"

namespace gpulet::gpu {
namespace {

using testing::MakeTempDir;

TEST(NvmlLoad, LoadsTheSimulatedDriverThroughDlopenAndInitialises) {
  Result<testing::SimNode> node = testing::OpenSimNode("dgx-h100");
  ASSERT_TRUE(node.ok()) << node.status().message();
  unsigned count = 0;
  ASSERT_EQ(node->nvml->fn().nvmlDeviceGetCount_v2(&count), NVML_SUCCESS);
  EXPECT_EQ(count, 8u);
  // Optional entry points the simulator exports are resolved too.
  EXPECT_NE(node->nvml->fn().nvmlDeviceGetMigMode, nullptr);
  EXPECT_NE(node->nvml->fn().nvmlDeviceGetTemperature, nullptr);
}

TEST(NvmlLoad, MissingLibraryIsAClearErrorWithItsOwnExitCode) {
  Result<std::shared_ptr<Nvml>> nvml = Nvml::Load("/nonexistent/libnvidia-ml.so.1");
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), ErrorCode::kNvmlLibraryMissing);
  EXPECT_EQ(nvml.status().exit_code(), 10);
  EXPECT_NE(nvml.status().message().find("/nonexistent/libnvidia-ml.so.1"), std::string::npos);
}

TEST(NvmlLoad, LibraryWithoutARequiredSymbolNamesTheSymbol) {
  Result<sim::SimulatedNode> node = sim::PrepareSimulation("dgx-h100", MakeTempDir());
  ASSERT_TRUE(node.ok()) << node.status().message();
  const std::string lib = std::string(GPULET_BUILD_DIR) + "/sim/missing-symbol/libnvidia-ml.so.1";
  Result<std::shared_ptr<Nvml>> nvml = Nvml::Load(lib);
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), ErrorCode::kNvmlSymbolMissing);
  EXPECT_NE(nvml.status().message().find("nvmlDeviceGetMemoryInfo"), std::string::npos)
      << nvml.status().message();
}

TEST(NvmlLoad, LibraryThatIsNotNvmlIsReportedAsMissingSymbol) {
  Result<std::shared_ptr<Nvml>> nvml = Nvml::Load("libm.so.6");
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), ErrorCode::kNvmlSymbolMissing);
  EXPECT_NE(nvml.status().message().find("nvmlInit_v2"), std::string::npos);
}

TEST(NvmlLoad, InitFailureCarriesTheDriverReason) {
  Result<std::string> base = sim::ResolveFixture("l4-pcie");
  ASSERT_TRUE(base.ok()) << base.status().message();
  const std::string dir = MakeTempDir();
  const std::string fixture = dir + "/broken-driver.yaml";
  {
    std::ifstream in(*base);
    std::ofstream out(fixture);
    out << in.rdbuf() << "\ninit_error: DRIVER_NOT_LOADED\n";
  }
  Result<sim::SimulatedNode> node = sim::PrepareSimulation(fixture, dir + "/state");
  ASSERT_TRUE(node.ok()) << node.status().message();
  Result<std::shared_ptr<Nvml>> nvml = Nvml::Load(node->library_path);
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), ErrorCode::kNvmlInitFailed);
  EXPECT_NE(nvml.status().message().find("NVML_ERROR_DRIVER_NOT_LOADED"), std::string::npos)
      << nvml.status().message();
}

TEST(NvmlReturnName, NamesTheCodesDiscoveryReports) {
  EXPECT_STREQ(NvmlReturnName(NVML_ERROR_GPU_IS_LOST), "NVML_ERROR_GPU_IS_LOST");
  EXPECT_STREQ(NvmlReturnName(NVML_SUCCESS), "NVML_SUCCESS");
  EXPECT_STREQ(NvmlReturnName(12345), "NVML_ERROR_UNKNOWN");
}

}  // namespace
}  // namespace gpulet::gpu
