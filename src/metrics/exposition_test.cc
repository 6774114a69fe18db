#include "metrics/exposition.h"

#include <gtest/gtest.h>

namespace gpulet::metrics {
namespace {

std::shared_ptr<const CounterSet> Counters(const char* text) {
  auto set = ParseCounters(text, "t.csv");
  EXPECT_TRUE(set.ok()) << set.status().message();
  return std::make_shared<const CounterSet>(std::move(set).value());
}

Snapshot TwoGpus() {
  Snapshot s;
  s.counters = Counters(
      "DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\n"
      "DCGM_FI_DEV_POWER_USAGE, gauge, Power draw (in W).\n"
      "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, counter, Total energy consumption since boot (in mJ).\n"
      "DCGM_FI_DEV_XID_ERRORS, gauge, Value of the last XID error encountered.\n"
      "DCGM_FI_DRIVER_VERSION, label, Driver Version\n");
  s.hostname = "node-1";
  for (unsigned i = 0; i < 2; ++i) {
    EntitySample e;
    e.key = {i, -1};
    e.gpu = {i, "GPU-" + std::to_string(i), "00000000:1" + std::to_string(i) + ":00.0",
             "NVIDIA H100 80GB HBM3"};
    e.values = {Value::Int(40 + i), Value::Double(70.5), Value::Int(1000 + i), Value::Int(i == 1 ? 79 : 0)};
    e.labels = {"550.54.15"};
    s.entities.push_back(e);
    s.gpus.push_back({e.gpu, true, ""});
  }
  return s;
}

// The simulated-driver marker follows the snapshot.
TEST(Exposition, SimulatedDriverMarker) {
  Snapshot s = TwoGpus();
  EXPECT_NE(Render(s, {}, {}).find("\ngpulet_simulated_driver{Hostname=\"node-1\"} 0\n"),
            std::string::npos);
  s.simulated = true;
  EXPECT_NE(Render(s, {}, {}).find("\ngpulet_simulated_driver{Hostname=\"node-1\"} 1\n"),
            std::string::npos);
  s.hostname.clear();  // --no-hostname
  EXPECT_NE(Render(s, {}, {}).find("\ngpulet_simulated_driver 1\n"), std::string::npos);
}

TEST(Exposition, Text004GoldenWithDcgmLabelOrder) {
  const std::string got = Render(TwoGpus(), {}, {});
  const std::string want =
      "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n"
      "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"
      "DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",UUID=\"GPU-0\",pci_bus_id=\"00000000:10:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-1\",DCGM_FI_DRIVER_VERSION=\"550.54.15\"} 40\n"
      "DCGM_FI_DEV_GPU_TEMP{gpu=\"1\",UUID=\"GPU-1\",pci_bus_id=\"00000000:11:00.0\",device=\"nvidia1\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-1\",DCGM_FI_DRIVER_VERSION=\"550.54.15\"} 41\n"
      "# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).\n"
      "# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n"
      "DCGM_FI_DEV_POWER_USAGE{gpu=\"0\",UUID=\"GPU-0\",pci_bus_id=\"00000000:10:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-1\",DCGM_FI_DRIVER_VERSION=\"550.54.15\"} 70.500000\n"
      "DCGM_FI_DEV_POWER_USAGE{gpu=\"1\",UUID=\"GPU-1\",pci_bus_id=\"00000000:11:00.0\",device=\"nvidia1\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-1\",DCGM_FI_DRIVER_VERSION=\"550.54.15\"} 70.500000\n"
      "# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).\n"
      "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"
      "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu=\"0\",UUID=\"GPU-0\",pci_bus_id=\"00000000:10:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-1\",DCGM_FI_DRIVER_VERSION=\"550.54.15\"} 1000\n"
      "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu=\"1\",UUID=\"GPU-1\",pci_bus_id=\"00000000:11:00.0\",device=\"nvidia1\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-1\",DCGM_FI_DRIVER_VERSION=\"550.54.15\"} 1001\n"
      "# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.\n"
      "# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n"
      "DCGM_FI_DEV_XID_ERRORS{gpu=\"0\",UUID=\"GPU-0\",pci_bus_id=\"00000000:10:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-1\",DCGM_FI_DRIVER_VERSION=\"550.54.15\",err_code=\"0\",err_msg=\"No Error\"} 0\n"
      "DCGM_FI_DEV_XID_ERRORS{gpu=\"1\",UUID=\"GPU-1\",pci_bus_id=\"00000000:11:00.0\",device=\"nvidia1\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-1\",DCGM_FI_DRIVER_VERSION=\"550.54.15\",err_code=\"79\",err_msg=\"GPU has fallen off the bus\"} 79\n"
      "# HELP gpulet_gpu_up 1 when gpulet read the GPU in the last collection, 0 when NVML reports it lost (its DCGM series are left out until it returns).\n"
      "# TYPE gpulet_gpu_up gauge\n"
      "gpulet_gpu_up{gpu=\"0\",UUID=\"GPU-0\",pci_bus_id=\"00000000:10:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-1\"} 1\n"
      "gpulet_gpu_up{gpu=\"1\",UUID=\"GPU-1\",pci_bus_id=\"00000000:11:00.0\",device=\"nvidia1\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-1\"} 1\n"
      "# HELP gpulet_simulated_driver 1 when the GPUs are simulated from a fixture (gpulet's simulated NVML), 0 on the real driver.\n"
      "# TYPE gpulet_simulated_driver gauge\n"
      "gpulet_simulated_driver{Hostname=\"node-1\"} 0\n";
  EXPECT_EQ(got, want);
}

TEST(Exposition, OpenMetricsKeepsNamesAndEndsWithEof) {
  const std::string got = Render(TwoGpus(), {}, {Format::kOpenMetrics, true});
  EXPECT_NE(got.find("# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION unknown\n"), std::string::npos);
  EXPECT_NE(got.find("\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu=\"0\""), std::string::npos);
  EXPECT_EQ(got.find("_total{"), std::string::npos);
  ASSERT_GE(got.size(), 6u);
  EXPECT_EQ(got.substr(got.size() - 6), "# EOF\n");
}

TEST(Exposition, PodsOnASharedGpuGetOneSeriesEach) {
  Snapshot s = TwoGpus();
  PodMap pods;
  pods[{1, -1}] = {{"ml", "train-a", "main"}, {"ml", "train-b", "worker"}};
  const std::string got = Render(s, pods, {});
  const std::string prefix =
      "DCGM_FI_DEV_GPU_TEMP{gpu=\"1\",UUID=\"GPU-1\",pci_bus_id=\"00000000:11:00.0\",device=\"nvidia1\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-1\",DCGM_FI_DRIVER_VERSION=\"550.54.15\",";
  EXPECT_NE(got.find(prefix + "container=\"main\",namespace=\"ml\",pod=\"train-a\"} 41\n"), std::string::npos) << got;
  EXPECT_NE(got.find(prefix + "container=\"worker\",namespace=\"ml\",pod=\"train-b\"} 41\n"), std::string::npos);
  // Attributes merge in key order: container, err_code, err_msg, namespace, pod.
  EXPECT_NE(got.find(",DCGM_FI_DRIVER_VERSION=\"550.54.15\",container=\"main\",err_code=\"79\",err_msg=\"GPU has fallen off the bus\",namespace=\"ml\",pod=\"train-a\"} 79\n"),
            std::string::npos);
  // GPU 0 holds no pod: no pod labels at all.
  EXPECT_NE(got.find("device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-1\",DCGM_FI_DRIVER_VERSION=\"550.54.15\"} 40\n"), std::string::npos);

  const std::string joined = Render(s, pods, {Format::kText004, false});
  EXPECT_NE(joined.find(prefix + "container=\"main,worker\",namespace=\"ml,ml\",pod=\"train-a,train-b\"} 41\n"), std::string::npos) << joined;
}

// A GPU allocated through DRA: the claim and the allocation result as dcgm-exporter names them
// (dra_claim_name, dra_claim_namespace, dra_device_name, dra_driver_name, dra_pool_name), in the
// same key order; a device plugin's pod on the same GPU gets none.
TEST(Exposition, DraClaimsLabelTheirPodsSeries) {
  Snapshot s = TwoGpus();
  PodMap pods;
  pods[{1, -1}] = {{"ml", "dp", "main"},
                   {"ml", "train", "main", "", "", "train-gpu", "ml", "gpu.gpulet.io", "node-1",
                    "gpu-1"}};
  const std::string got = Render(s, pods, {});
  const std::string prefix =
      "DCGM_FI_DEV_GPU_TEMP{gpu=\"1\",UUID=\"GPU-1\",pci_bus_id=\"00000000:11:00.0\",device=\"nvidia1\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-1\",DCGM_FI_DRIVER_VERSION=\"550.54.15\",";
  EXPECT_NE(got.find(prefix +
                     "container=\"main\",dra_claim_name=\"train-gpu\",dra_claim_namespace=\"ml\","
                     "dra_device_name=\"gpu-1\",dra_driver_name=\"gpu.gpulet.io\",dra_pool_name=\"node-1\","
                     "namespace=\"ml\",pod=\"train\"} 41\n"),
            std::string::npos)
      << got;
  EXPECT_NE(got.find(prefix + "container=\"main\",namespace=\"ml\",pod=\"dp\"} 41\n"), std::string::npos)
      << got;
  const std::string joined = Render(s, pods, {Format::kText004, false});
  EXPECT_NE(joined.find(prefix +
                        "container=\"main,main\",dra_claim_name=\",train-gpu\",dra_claim_namespace=\",ml\","
                        "dra_device_name=\",gpu-1\",dra_driver_name=\",gpu.gpulet.io\","
                        "dra_pool_name=\",node-1\",namespace=\"ml,ml\",pod=\"dp,train\"} 41\n"),
            std::string::npos)
      << joined;
}

TEST(Exposition, MigSeriesCarryInstanceLabels) {
  Snapshot s;
  s.counters = Counters("DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).\n");
  EntitySample e;
  e.key = {3, 2};
  e.gpu = {3, "GPU-3", "00000000:40:00.0", "NVIDIA A100-SXM4-80GB"};
  e.mig_profile = "3g.40gb";
  e.values = {Value::Int(1024)};
  s.entities.push_back(e);
  const std::string got = Render(s, {}, {});
  EXPECT_NE(got.find("DCGM_FI_DEV_FB_USED{gpu=\"3\",UUID=\"GPU-3\",pci_bus_id=\"00000000:40:00.0\",device=\"nvidia3\",modelName=\"NVIDIA A100-SXM4-80GB\",GPU_I_PROFILE=\"3g.40gb\",GPU_I_ID=\"2\"} 1024\n"),
            std::string::npos)
      << got;
}

TEST(Exposition, LostGpuIsMarkedAndOthersStay) {
  Snapshot s = TwoGpus();
  s.entities.erase(s.entities.begin());  // GPU 0 lost: the sampler leaves no entity for it
  s.gpus[0].up = false;
  const std::string got = Render(s, {}, {});
  EXPECT_EQ(got.find("device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-1\",DCGM"), std::string::npos);
  EXPECT_NE(got.find("gpulet_gpu_up{gpu=\"0\",UUID=\"GPU-0\",pci_bus_id=\"00000000:10:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-1\"} 0\n"), std::string::npos);
  EXPECT_NE(got.find("DCGM_FI_DEV_GPU_TEMP{gpu=\"1\""), std::string::npos);
}

TEST(Exposition, EscapesLabelValuesAndHelp) {
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  EXPECT_EQ(EscapeLabelValue("plain"), "plain");
  // Not UTF-8 (a tenant's job or pod name): Prometheus would refuse the whole scrape.
  EXPECT_EQ(EscapeLabelValue("a\xff\"b"), "a\xEF\xBF\xBD\\\"b");
  EXPECT_EQ(EscapeLabelValue("\xc3\x28"), "\xEF\xBF\xBD(");
  EXPECT_EQ(EscapeLabelValue("caf\xc3\xa9"), "caf\xc3\xa9");
  EXPECT_EQ(EscapeHelp("x \"q\" \\ \n", Format::kText004), "x \"q\" \\\\ \\n");
  EXPECT_EQ(EscapeHelp("x \"q\"", Format::kOpenMetrics), "x \\\"q\\\"");
  Snapshot s = TwoGpus();
  s.hostname = "we\"ird\\host";
  const std::string got = Render(s, {}, {});
  EXPECT_NE(got.find("Hostname=\"we\\\"ird\\\\host\""), std::string::npos);
}

TEST(Exposition, MissingValuesLeaveNoSeriesAndNoEmptyFamily) {
  Snapshot s = TwoGpus();
  for (auto& e : s.entities) e.values[1].reset();
  const std::string got = Render(s, {}, {});
  EXPECT_EQ(got.find("DCGM_FI_DEV_POWER_USAGE"), std::string::npos);
  EXPECT_EQ(XidMessage(12345), "Unknown Error");
  EXPECT_EQ(FormatValue(Value::Double(1.5)), "1.500000");
  EXPECT_EQ(FormatValue(Value::Int(-3)), "-3");
}

}  // namespace
}  // namespace gpulet::metrics

namespace gpulet::metrics {
namespace {

TEST(Exposition, SlurmJobsBecomeHpcJobAttribute) {
  Snapshot s = TwoGpus();
  JobMap jobs = {{1, "12,15"}};
  const std::string got = Render(s, {}, {}, &jobs);
  EXPECT_NE(got.find("DCGM_FI_DRIVER_VERSION=\"550.54.15\",hpc_job=\"12,15\"} 41\n"), std::string::npos) << got;
  // Attribute order: err_code, err_msg, hpc_job.
  EXPECT_NE(got.find("err_msg=\"GPU has fallen off the bus\",hpc_job=\"12,15\"} 79\n"), std::string::npos);
  EXPECT_NE(got.find("device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-1\",DCGM_FI_DRIVER_VERSION=\"550.54.15\"} 40\n"),
            std::string::npos);
}

}  // namespace
}  // namespace gpulet::metrics
