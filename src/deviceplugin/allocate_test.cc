#include "deviceplugin/allocate.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "deviceplugin/test_inventories.h"

namespace gpulet::deviceplugin {
namespace {

using config::DeviceIdStrategy;
using config::DeviceListStrategy;

class AllocateTest : public ::testing::Test {
 protected:
  gpu::Inventory inv_ = testing::DgxH100Like();
  sharing::Resource r_ = testing::GpuResource(inv_);
  std::vector<std::string> Ids(std::vector<unsigned> gpus) {
    std::vector<std::string> out;
    for (unsigned g : gpus) out.push_back(r_.devices.at(g).id);
    return out;
  }
  v1beta1::ContainerAllocateResponse Build(const AllocateOptions& o, std::vector<unsigned> gpus) {
    Result<v1beta1::ContainerAllocateResponse> r =
        BuildContainerAllocateResponse(r_, inv_, o, Ids(gpus), "u1");
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : v1beta1::ContainerAllocateResponse{};
  }
};

TEST_F(AllocateTest, EnvvarWithUuids) {
  v1beta1::ContainerAllocateResponse r = Build({}, {3, 1});
  EXPECT_EQ(r.envs().at("NVIDIA_VISIBLE_DEVICES"), inv_.gpus[3].uuid + "," + inv_.gpus[1].uuid);
  EXPECT_EQ(r.mounts_size(), 0);
  EXPECT_EQ(r.devices_size(), 0);
  EXPECT_TRUE(r.annotations().empty());
}

TEST_F(AllocateTest, EnvvarWithIndices) {
  AllocateOptions o;
  o.device_id_strategy = DeviceIdStrategy::kIndex;
  EXPECT_EQ(Build(o, {0, 5}).envs().at("NVIDIA_VISIBLE_DEVICES"), "0,5");
}

TEST_F(AllocateTest, VolumeMounts) {
  AllocateOptions o;
  o.device_list_strategies = {DeviceListStrategy::kVolumeMounts};
  v1beta1::ContainerAllocateResponse r = Build(o, {2});
  EXPECT_EQ(r.envs().at("NVIDIA_VISIBLE_DEVICES"), "/var/run/nvidia-container-devices");
  ASSERT_EQ(r.mounts_size(), 1);
  EXPECT_EQ(r.mounts(0).container_path(), "/var/run/nvidia-container-devices/" + inv_.gpus[2].uuid);
  EXPECT_EQ(r.mounts(0).host_path(), "/dev/null");
}

TEST_F(AllocateTest, CdiAnnotationsAndCri) {
  AllocateOptions o;
  o.device_list_strategies = {DeviceListStrategy::kCdiAnnotations, DeviceListStrategy::kCdiCri};
  v1beta1::ContainerAllocateResponse r = Build(o, {0, 1});
  EXPECT_EQ(r.envs().count("NVIDIA_VISIBLE_DEVICES"), 0u);
  const std::string names =
      "nvidia.com/gpu=" + inv_.gpus[0].uuid + ",nvidia.com/gpu=" + inv_.gpus[1].uuid;
  ASSERT_EQ(r.annotations().size(), 1u);
  EXPECT_EQ(r.annotations().at("cdi.k8s.io/gpulet_u1"), names);
  ASSERT_EQ(r.cdi_devices_size(), 2);
  EXPECT_EQ(r.cdi_devices(0).name(), "nvidia.com/gpu=" + inv_.gpus[0].uuid);
  EXPECT_EQ(r.cdi_devices(1).name(), "nvidia.com/gpu=" + inv_.gpus[1].uuid);
}

TEST_F(AllocateTest, DeviceSpecsUnderDevRoot) {
  // A dev root with nvidia-modeset but no nvidia-uvm-tools (a node without the UVM tools node).
  char tmpl[] = "/tmp/gpulet-devroot-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string root = tmpl;
  ASSERT_EQ(mkdir((root + "/dev").c_str(), 0755), 0);
  std::ofstream(root + "/dev/nvidia-modeset") << "";
  AllocateOptions o;
  o.pass_device_specs = true;
  o.nvidia_dev_root = root + "/";
  v1beta1::ContainerAllocateResponse r = Build(o, {6});
  std::vector<std::pair<std::string, std::string>> got;
  for (const auto& d : r.devices()) {
    EXPECT_EQ(d.permissions(), "rw");
    got.emplace_back(d.container_path(), d.host_path());
  }
  std::vector<std::pair<std::string, std::string>> want = {
      {"/dev/nvidiactl", root + "/dev/nvidiactl"},
      {"/dev/nvidia-uvm", root + "/dev/nvidia-uvm"},
      {"/dev/nvidia-modeset", root + "/dev/nvidia-modeset"},
      {"/dev/nvidia6", root + "/dev/nvidia6"}};
  EXPECT_EQ(got, want) << "nvidia-uvm-tools is absent, so it is not listed";
  // With both optional nodes present, both are listed.
  std::ofstream(root + "/dev/nvidia-uvm-tools") << "";
  EXPECT_EQ(Build(o, {6}).devices_size(), 5);
  std::filesystem::remove_all(root);
}

TEST_F(AllocateTest, RejectsUnknownDuplicatedAndEmpty) {
  Result<v1beta1::ContainerAllocateResponse> unknown =
      BuildContainerAllocateResponse(r_, inv_, {}, {"GPU-nope"}, "u");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), ErrorCode::kInvalidInput);
  EXPECT_NE(unknown.status().message().find("unknown device ID \"GPU-nope\""), std::string::npos);
  EXPECT_NE(unknown.status().message().find("nvidia.com/gpu"), std::string::npos);

  Result<v1beta1::ContainerAllocateResponse> dup =
      BuildContainerAllocateResponse(r_, inv_, {}, Ids({1, 2, 1}), "u");
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("requested twice"), std::string::npos);

  EXPECT_FALSE(BuildContainerAllocateResponse(r_, inv_, {}, {}, "u").ok());
}

TEST_F(AllocateTest, ReplicasOfOneGpuAreNamedOnce) {
  sharing::Resource shared;
  shared.name = "nvidia.com/gpu.shared";
  shared.replicas = 2;
  for (int n = 0; n < 2; ++n) {
    sharing::AdvertisedDevice d = r_.devices[4];
    d.id = d.uuid + "::" + std::to_string(n);
    d.replica = n;
    shared.devices.push_back(d);
  }
  Result<v1beta1::ContainerAllocateResponse> r = BuildContainerAllocateResponse(
      shared, inv_, {}, {shared.devices[0].id, shared.devices[1].id}, "u");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->envs().at("NVIDIA_VISIBLE_DEVICES"), inv_.gpus[4].uuid);

  shared.fail_requests_greater_than_one = true;
  Result<v1beta1::ContainerAllocateResponse> rejected = BuildContainerAllocateResponse(
      shared, inv_, {}, {shared.devices[0].id, shared.devices[1].id}, "u");
  ASSERT_FALSE(rejected.ok());
  EXPECT_NE(
      rejected.status().message().find("accepts requests for 1 replica only, got a request for 2"),
      std::string::npos);
}

}  // namespace
}  // namespace gpulet::deviceplugin
