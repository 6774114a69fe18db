// Opaque config: the accepted shapes, each refusal naming the config and the field, unknown fields
// accepted, and which config applies to a device (claim over class, request names, kinds).
#include "dra/opaque_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dra/names.h"

namespace gpulet::dra {
namespace {

using ::testing::HasSubstr;

OpaqueConfig Config(const std::string& params, std::vector<std::string> requests = {},
                    bool from_class = false, const std::string& where = "ResourceClaim ns/c: "
                                                                        "spec.devices.config[0]") {
  OpaqueConfig c;
  c.driver = kDriverName;
  c.parameters_json = params;
  c.requests = std::move(requests);
  c.from_class = from_class;
  c.where = where;
  return c;
}

std::string Gpu(const std::string& sharing) {
  return R"({"apiVersion":"resource.gpulet.io/v1","kind":"GpuConfig","sharing":)" + sharing + "}";
}

TEST(OpaqueConfigTest, ParsesTimeSlicingAndMps) {
  Result<DeviceConfig> t = ParseDeviceConfig(
      Config(Gpu(R"({"strategy":"TimeSlicing","timeSlicing":{"interval":"Long"}})")));
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->kind, ConfigKind::kGpu);
  EXPECT_EQ(t->strategy, SharingStrategy::kTimeSlicing);
  EXPECT_EQ(t->interval, "Long");

  Result<DeviceConfig> m = ParseDeviceConfig(Config(Gpu(
      R"({"strategy":"MPS","mps":{"defaultActiveThreadPercentage":50,"defaultPinnedDeviceMemoryLimit":"10Gi"}})")));
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->strategy, SharingStrategy::kMps);
  EXPECT_EQ(m->mps.active_thread_percentage, 50);
  EXPECT_EQ(m->mps.pinned_memory_bytes, 10ull << 30);

  Result<DeviceConfig> none = ParseDeviceConfig(
      Config(R"({"apiVersion":"resource.gpulet.io/v1","kind":"MigDeviceConfig"})"));
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_EQ(none->kind, ConfigKind::kMigDevice);
  EXPECT_EQ(none->strategy, SharingStrategy::kTimeSlicing);
}

TEST(OpaqueConfigTest, UnknownFieldsAreAccepted) {
  Result<DeviceConfig> c = ParseDeviceConfig(Config(
      R"({"apiVersion":"resource.gpulet.io/v1","kind":"GpuConfig","future":1,
          "sharing":{"strategy":"MPS","later":true,"mps":{"multiUser":true}}})"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->strategy, SharingStrategy::kMps);
}

TEST(OpaqueConfigTest, RefusalsNameTheConfigAndTheField) {
  const std::string where = "ResourceClaim ns/c: spec.devices.config[0]: parameters.";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[1,2]", "ResourceClaim ns/c: spec.devices.config[0]: parameters: not a JSON object"},
      {"{", "parameters: not a JSON object"},
      {R"({"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig"})",
       where + "apiVersion: must be resource.gpulet.io/v1, got \"resource.nvidia.com/v1beta1\""},
      {R"({"apiVersion":"resource.gpulet.io/v1","kind":"VfioDeviceConfig"})",
       where + "kind: must be GpuConfig or MigDeviceConfig"},
      {R"({"apiVersion":"resource.gpulet.io/v1"})", where + "kind: must be GpuConfig"},
      {Gpu("3"), where + "sharing: must be an object, got 3"},
      {Gpu(R"({"strategy":"Spatial"})"), where + "sharing.strategy: must be TimeSlicing or MPS"},
      {Gpu(R"({"strategy":"TimeSlicing","mps":{}})"), where + "sharing.mps: given with strategy "
                                                            "TimeSlicing"},
      {Gpu(R"({"strategy":"MPS","timeSlicing":{}})"), where + "sharing.timeSlicing: given with "
                                                            "strategy MPS"},
      {Gpu(R"({"timeSlicing":{"interval":"Forever"}})"),
       where + "sharing.timeSlicing.interval: must be Default, Short, Medium or Long"},
      {Gpu(R"({"strategy":"MPS","mps":{"defaultActiveThreadPercentage":150}})"),
       where + "sharing.mps.defaultActiveThreadPercentage: must be an integer 1..100, got 150"},
      {Gpu(R"({"strategy":"MPS","mps":{"defaultActiveThreadPercentage":"50"}})"),
       where + "sharing.mps.defaultActiveThreadPercentage"},
      {Gpu(R"({"strategy":"MPS","mps":{"defaultPinnedDeviceMemoryLimit":"ten"}})"),
       where + "sharing.mps.defaultPinnedDeviceMemoryLimit: must be a quantity like 10Gi"},
      {Gpu(R"({"strategy":"MPS","mps":{"defaultPinnedDeviceMemoryLimit":"0"}})"),
       where + "sharing.mps.defaultPinnedDeviceMemoryLimit"},
      {Gpu(R"({"strategy":"MPS","mps":{"defaultPinnedDeviceMemoryLimit":"2Pi"}})"),
       where + "sharing.mps.defaultPinnedDeviceMemoryLimit"},
      {Gpu(R"({"strategy":"MPS","mps":{"defaultPinnedDeviceMemoryLimit":1024}})"),
       where + "sharing.mps.defaultPinnedDeviceMemoryLimit"},
  };
  for (const auto& [params, want] : cases) {
    Result<DeviceConfig> r = ParseDeviceConfig(Config(params));
    ASSERT_FALSE(r.ok()) << params;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidInput);
    EXPECT_THAT(r.status().message(), HasSubstr(want)) << params;
  }
  Result<DeviceConfig> big = ParseDeviceConfig(Config(std::string(11 * 1024, ' ')));
  ASSERT_FALSE(big.ok());
  EXPECT_THAT(big.status().message(), HasSubstr("larger than 10 KiB"));
}

TEST(OpaqueConfigTest, ClaimConfigsOverrideClassConfigsAndRequestsSelect) {
  const std::string ts = Gpu(R"({"strategy":"TimeSlicing"})");
  const std::string mps = Gpu(R"({"strategy":"MPS"})");
  const std::string mig = R"({"apiVersion":"resource.gpulet.io/v1","kind":"MigDeviceConfig",
                              "sharing":{"strategy":"MPS"}})";
  // The claim's config is listed before the class's here: precedence is by source, not order.
  const std::vector<OpaqueConfig> configs = {
      Config(mps, {"train"}, false, "claim[0]"),
      Config(ts, {}, true, "class[0]"),
      Config(mig, {}, true, "class[1]"),
  };
  Result<std::optional<DeviceConfig>> a = ConfigFor(configs, "train", ConfigKind::kGpu);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a->has_value());
  EXPECT_EQ((*a)->strategy, SharingStrategy::kMps);
  EXPECT_EQ((*a)->where, "claim[0]");
  // A subrequest matches its request's name.
  Result<std::optional<DeviceConfig>> sub = ConfigFor(configs, "train/big", ConfigKind::kGpu);
  ASSERT_TRUE(sub.ok() && sub->has_value());
  EXPECT_EQ((*sub)->where, "claim[0]");
  Result<std::optional<DeviceConfig>> b = ConfigFor(configs, "infer", ConfigKind::kGpu);
  ASSERT_TRUE(b.ok() && b->has_value());
  EXPECT_EQ((*b)->where, "class[0]");
  Result<std::optional<DeviceConfig>> m = ConfigFor(configs, "infer", ConfigKind::kMigDevice);
  ASSERT_TRUE(m.ok() && m->has_value());
  EXPECT_EQ((*m)->where, "class[1]");
  Result<std::optional<DeviceConfig>> none = ConfigFor({configs[0]}, "infer", ConfigKind::kGpu);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  // An invalid config that applies is an error; one that does not apply is not read here.
  std::vector<OpaqueConfig> bad = {Config("{", {"train"}, false, "claim[1]")};
  EXPECT_FALSE(ConfigFor(bad, "train", ConfigKind::kGpu).ok());
  EXPECT_TRUE(ConfigFor(bad, "infer", ConfigKind::kGpu).ok());
}

}  // namespace
}  // namespace gpulet::dra
