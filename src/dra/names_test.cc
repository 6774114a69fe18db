#include "dra/names.h"

#include <gtest/gtest.h>

namespace gpulet::dra {
namespace {

TEST(DraNames, EveryKindRoundTrips) {
  for (const DeviceName& n : {DeviceName{DeviceKind::kGpu, 0, "", 0},
                              DeviceName{DeviceKind::kMemoryShare, 15, "", 0},
                              DeviceName{DeviceKind::kMig, 7, "1g-10gb-me", 6}}) {
    auto parsed = ParseDeviceName(FormatDeviceName(n));
    ASSERT_TRUE(parsed.has_value()) << FormatDeviceName(n);
    EXPECT_EQ(parsed->kind, n.kind);
    EXPECT_EQ(parsed->gpu_index, n.gpu_index);
    EXPECT_EQ(parsed->mig_profile, n.mig_profile);
    EXPECT_EQ(parsed->mig_start, n.mig_start);
  }
}

TEST(DraNames, MigNamesCarryTheProfileSlugAndStart) {
  EXPECT_EQ(ProfileSlug("1g.10gb+me"), "1g-10gb-me");
  EXPECT_EQ(ProfileSlug("1c.3g.40gb"), "1c-3g-40gb");
  EXPECT_EQ(FormatDeviceName({DeviceKind::kMig, 3, "3g.40gb", 4}), "gpu-3-mig-3g-40gb-4");
  auto parsed = ParseDeviceName("gpu-3-mig-3g-40gb-4");
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->mig_profile, ProfileSlug("3g.40gb"));
}

TEST(DraNames, NamesThisDriverNeverPublishesAreRefused) {
  for (const char* bad : {"", "gpu", "gpu-", "gpu-x", "gpu-01", "gpu--1", "gpu-1-", "gpu-1-memx",
                          "gpu-1-mig-", "gpu-1-mig-1g-10gb", "gpu-1-mig-1g-10gb-", "gpu-1-mig-1G-10gb-0",
                          "gpu-1-mig--0", "gpu-99999999999", "nic-0"}) {
    EXPECT_FALSE(ParseDeviceName(bad).has_value()) << bad;
  }
  EXPECT_FALSE(ParseDeviceName("gpu-1-mig-" + std::string(60, 'a') + "-0").has_value());
}

TEST(DraNames, DevicePluginSocketsNameTheirResource) {
  EXPECT_EQ(DevicePluginSocketResource("nvidia-gpu.sock"), "nvidia.com/gpu");
  EXPECT_EQ(DevicePluginSocketResource("nvidia-mig-1g.10gb.sock"), "nvidia.com/mig-1g.10gb");
  EXPECT_EQ(DevicePluginSocketResource("nvidia-.sock"), std::nullopt);
  EXPECT_EQ(DevicePluginSocketResource("kubelet.sock"), std::nullopt);
  EXPECT_EQ(DevicePluginSocketResource("nvidia-gpu.sock.tmp"), std::nullopt);
  EXPECT_TRUE(MappedByShippedDeviceClasses("nvidia.com/gpu"));
  EXPECT_TRUE(MappedByShippedDeviceClasses("nvidia.com/mig-1g.10gb"));
  EXPECT_FALSE(MappedByShippedDeviceClasses("nvidia.com/gpu.shared"));
}

}  // namespace
}  // namespace gpulet::dra
