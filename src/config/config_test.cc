#include "config/config.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace gpulet::config {
namespace {

namespace fs = std::filesystem;

fs::path TestData() { return fs::path(GPULET_SOURCE_DIR) / "src" / "config" / "testdata"; }

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<fs::path> Files(const std::string& sub) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(TestData() / sub)) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// The corpus: every file under good/ parses, and one whose first line is "# warns: TEXT" has a
// warning starting with TEXT (the others have none); every file under bad/ fails with
// kInvalidInput and a message containing its first line's "# expect: " text (file names are
// relative to testdata/).
TEST(ConfigCorpus, GoodFilesParse) {
  auto files = Files("good");
  ASSERT_GE(files.size(), 5u);
  for (const auto& f : files) {
    const std::string name = "good/" + f.filename().string();
    const std::string text = ReadFile(f);
    auto c = ParseConfig(text, name);
    ASSERT_TRUE(c.ok()) << name << ": " << c.status().message();
    const std::string marker = "# warns: ";
    if (text.rfind(marker, 0) != 0) {
      EXPECT_TRUE(c->warnings.empty()) << name << ": " << c->warnings.front();
      continue;
    }
    const std::string expect = text.substr(marker.size(), text.find('\n') - marker.size());
    bool found = false;
    for (const std::string& w : c->warnings) found = found || w.rfind(expect, 0) == 0;
    EXPECT_TRUE(found) << name << ": no warning starts with: " << expect;
  }
}

TEST(ConfigCorpus, BadFilesFailWithLocation) {
  auto files = Files("bad");
  ASSERT_GE(files.size(), 30u);
  for (const auto& f : files) {
    const std::string name = "bad/" + f.filename().string();
    const std::string text = ReadFile(f);
    const std::string marker = "# expect: ";
    ASSERT_EQ(text.rfind(marker, 0), 0u) << name << " lacks a '# expect: ' first line";
    const std::string expect = text.substr(marker.size(), text.find('\n') - marker.size());
    auto c = ParseConfig(text, name);
    ASSERT_FALSE(c.ok()) << name << " parsed but should fail with: " << expect;
    EXPECT_EQ(c.status().code(), ErrorCode::kInvalidInput) << name;
    EXPECT_NE(c.status().message().find(expect), std::string::npos)
        << name << "\n  got:  " << c.status().message() << "\n  want: " << expect;
    // Every error names the file and a line.
    EXPECT_EQ(c.status().message().rfind(name + ":", 0), 0u) << c.status().message();
  }
}

TEST(Config, FullFileValues) {
  auto c = LoadConfigFile((TestData() / "good" / "full.yaml").string());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->version, "v1");
  EXPECT_EQ(c->flags.mig_strategy, MigStrategy::kMixed);
  EXPECT_EQ(c->flags.fail_on_init_error, true);
  EXPECT_EQ(c->flags.nvidia_driver_root, "/run/nvidia/driver");
  EXPECT_EQ(c->flags.nvidia_dev_root, "/");
  EXPECT_EQ(c->flags.plugin.pass_device_specs, true);
  ASSERT_TRUE(c->flags.plugin.device_list_strategy);
  EXPECT_EQ(*c->flags.plugin.device_list_strategy,
            (std::vector{DeviceListStrategy::kEnvvar, DeviceListStrategy::kCdiAnnotations}));
  EXPECT_EQ(c->flags.plugin.device_id_strategy, DeviceIdStrategy::kIndex);
  EXPECT_EQ(c->flags.plugin.container_driver_root, "/driver-root");
  EXPECT_FALSE(c->flags.has_gfd_section);
  ASSERT_TRUE(c->sharing.time_slicing);
  EXPECT_FALSE(c->sharing.mps);
  const auto& ts = *c->sharing.time_slicing;
  EXPECT_FALSE(ts.rename_by_default);
  EXPECT_EQ(ts.fail_requests_greater_than_one, true);
  ASSERT_EQ(ts.resources.size(), 1u);
  EXPECT_EQ(ts.resources[0].name, "nvidia.com/gpu");
  EXPECT_EQ(ts.resources[0].advertised_name, "nvidia.com/gpu");
  EXPECT_EQ(ts.resources[0].rename, "");
  EXPECT_EQ(ts.resources[0].replicas, 4);
  EXPECT_EQ(ts.resources[0].devices.kind, DeviceSelection::Kind::kAll);
  EXPECT_EQ(ts.resources[0].where.line, 17);
  EXPECT_EQ(ts.resources[0].where.field, "sharing.timeSlicing.resources[0]");
  EXPECT_EQ(ts.where.ToString(), TestData().string() + "/good/full.yaml:14: sharing.timeSlicing");
}

TEST(Config, AbsentFlagsStayUnset) {
  auto c = ParseConfig("version: v1\nflags:\n  migStrategy: single\n", "x.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->flags.mig_strategy, MigStrategy::kSingle);
  EXPECT_FALSE(c->flags.fail_on_init_error);
  EXPECT_FALSE(c->flags.nvidia_driver_root);
  EXPECT_FALSE(c->flags.plugin.pass_device_specs);
  EXPECT_FALSE(c->flags.plugin.device_list_strategy);
  EXPECT_FALSE(c->flags.plugin.device_id_strategy);
  EXPECT_FALSE(c->sharing.time_slicing);
  EXPECT_FALSE(c->sharing.mps);
  EXPECT_EQ(c->source, "x.yaml");
}

TEST(Config, NullValuesCountAsAbsent) {
  auto c = ParseConfig("flags:\n  failOnInitError: ~\n  nvidiaDriverRoot:\n", "x.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_FALSE(c->flags.fail_on_init_error);
  EXPECT_FALSE(c->flags.nvidia_driver_root);
}

TEST(Config, PerGpuSharing) {
  auto c = LoadConfigFile((TestData() / "good" / "per_gpu_sharing.yaml").string());
  ASSERT_TRUE(c.ok()) << c.status().message();
  const auto& rs = c->sharing.time_slicing->resources;
  ASSERT_EQ(rs.size(), 4u);
  EXPECT_EQ(rs[0].name, "nvidia.com/gpu");
  EXPECT_EQ(rs[0].rename, "nvidia.com/gpu.shared");
  EXPECT_EQ(rs[0].advertised_name, "nvidia.com/gpu.shared");
  ASSERT_EQ(rs[0].devices.kind, DeviceSelection::Kind::kList);
  ASSERT_EQ(rs[0].devices.list.size(), 3u);
  EXPECT_EQ(rs[0].devices.list[0].id, "0");
  EXPECT_EQ(rs[0].devices.list[0].kind, DeviceRef::Kind::kIndex);
  EXPECT_EQ(rs[0].devices.list[1].id, "1");
  EXPECT_EQ(rs[0].devices.list[2].kind, DeviceRef::Kind::kGpuUuid);
  EXPECT_EQ(rs[0].devices.list[2].where.line, 10);
  EXPECT_EQ(rs[0].devices.list[2].where.field, "sharing.timeSlicing.resources[0].devices[2]");
  EXPECT_EQ(rs[1].devices.list[0].kind, DeviceRef::Kind::kIndex);
  EXPECT_EQ(rs[1].replicas, 8);
  EXPECT_EQ(rs[2].advertised_name, "nvidia.com/mig-1g.10gb");
  EXPECT_EQ(rs[2].devices.kind, DeviceSelection::Kind::kAll);
  EXPECT_EQ(rs[3].devices.list[0].kind, DeviceRef::Kind::kMigIndex);
  EXPECT_EQ(rs[3].devices.list[1].kind, DeviceRef::Kind::kMigUuid);
}

TEST(Config, RenameByDefaultAndCount) {
  auto c = LoadConfigFile((TestData() / "good" / "rename_by_default.yaml").string());
  ASSERT_TRUE(c.ok()) << c.status().message();
  const auto& r = c->sharing.time_slicing->resources.at(0);
  EXPECT_EQ(r.advertised_name, "nvidia.com/gpu.shared");
  EXPECT_EQ(r.devices.kind, DeviceSelection::Kind::kCount);
  EXPECT_EQ(r.devices.count, 2);
}

TEST(Config, MpsLeavesFailRequestsUnsetForStrategyDefault) {
  auto c = LoadConfigFile((TestData() / "good" / "nvidia_mps_example.yaml").string());
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_TRUE(c->sharing.mps);
  EXPECT_FALSE(c->sharing.mps->fail_requests_greater_than_one);
  EXPECT_EQ(c->sharing.mps->resources.at(0).replicas, 10);
}

TEST(Config, FlowStyleAndCommaList) {
  auto c = LoadConfigFile((TestData() / "good" / "flow_style.yaml").string());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(*c->flags.plugin.device_list_strategy,
            (std::vector{DeviceListStrategy::kVolumeMounts, DeviceListStrategy::kCdiCri}));
}

TEST(Config, CompatKeysAccepted) {
  auto c = LoadConfigFile((TestData() / "good" / "gfd_and_compat.yaml").string());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE(c->flags.has_gfd_section);
  EXPECT_EQ(c->flags.plugin.mps_root, "/run/nvidia/mps");
  EXPECT_EQ(c->flags.mig_strategy, MigStrategy::kSingle);
}

// Every key upstream's v1 API has loads; what gpulet does not act on is one warning each.
TEST(Config, UpstreamKeysLoadWithOneWarningEach) {
  auto c = LoadConfigFile((TestData() / "good" / "upstream_everything.yaml").string());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->flags.plugin.mps_root, "/run/nvidia/mps");
  EXPECT_EQ(c->flags.plugin.kubelet_socket, "/var/lib/kubelet/device-plugins/kubelet.sock");
  EXPECT_EQ(c->flags.plugin.shared_devices_allocation_policy, "packed");
  EXPECT_EQ(*c->flags.plugin.device_list_strategy, std::vector{DeviceListStrategy::kEnvvar});
  ASSERT_TRUE(c->sharing.time_slicing);
  std::vector<std::string> fields;
  for (const std::string& w : c->warnings) {
    // "FILE:LINE: field: ..."
    const size_t a = w.find(": ");
    fields.push_back(w.substr(a + 2, w.find(": ", a + 2) - a - 2));
  }
  EXPECT_EQ(fields, (std::vector<std::string>{
                        "flags.gdsEnabled", "flags.mofedEnabled", "flags.useNodeFeatureAPI",
                        "flags.plugin.deviceListStrategy[1]", "resources", "imex"}));
  EXPECT_EQ(c->warnings[4].rfind(TestData().string() + "/good/upstream_everything.yaml:34: ", 0),
            0u)
      << c->warnings[4];
}

TEST(Config, UpstreamMpsRootWinsOverPluginMpsRoot) {
  for (const char* text : {"flags: {mpsRoot: /a, plugin: {mpsRoot: /b}}",
                           "flags: {plugin: {mpsRoot: /b}, mpsRoot: /a}"}) {
    auto c = ParseConfig(text, "m.yaml");
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_EQ(c->flags.plugin.mps_root, "/a") << text;
  }
  auto c = ParseConfig("flags: {plugin: {mpsRoot: /b}}", "m.yaml");
  EXPECT_EQ(c->flags.plugin.mps_root, "/b");
  EXPECT_TRUE(c->warnings.empty());
}

TEST(Config, TimeSlicingAndMpsTogetherMeansMps) {
  auto c = LoadConfigFile((TestData() / "good" / "both_strategies.yaml").string());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_FALSE(c->sharing.time_slicing);
  ASSERT_TRUE(c->sharing.mps);
  EXPECT_EQ(c->warnings.size(), 1u);
}

TEST(Config, UnknownKeysIgnoredRestApplies) {
  auto c = ParseConfig("flags:\n  newThing: 3\n  migStrategy: mixed\n", "u.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->flags.mig_strategy, MigStrategy::kMixed);
  ASSERT_EQ(c->warnings.size(), 1u);
  EXPECT_EQ(c->warnings[0].rfind("u.yaml:2: flags.newThing: unknown key, ignored", 0), 0u)
      << c->warnings[0];
}

TEST(Config, IgnoredKeysSetFalseAreSilent) {
  auto c = ParseConfig(
      "flags: {gdsEnabled: false, mofedEnabled: false, useNodeFeatureAPI: false, "
      "deviceDiscoveryStrategy: nvml}\nimex: {}\nresources: {}\n",
      "s.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE(c->warnings.empty()) << c->warnings.front();
  EXPECT_FALSE(ParseConfig("flags: {gdsEnabled: maybe}", "s.yaml").ok());
}

// Upstream: nvidia.com/<name> is at most 63 characters; <name> is a DNS subdomain.
TEST(Config, ResourceNameRulesAsUpstream) {
  auto parse = [](const std::string& name) {
    return ParseConfig(
        "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, rename: " + name + "}]}}",
        "n.yaml");
  };
  const std::string longest(63 - 11, 'a');
  EXPECT_TRUE(parse(longest).ok());
  EXPECT_TRUE(parse("nvidia.com/" + longest).ok());
  EXPECT_FALSE(parse(longest + "a").ok());
  EXPECT_TRUE(parse("gpu.shared-1").ok());
  for (const char* bad : {"GPU", "gpu_shared", "gpu..x", "-gpu", "gpu.", "a.-b"}) {
    auto c = parse(bad);
    EXPECT_FALSE(c.ok()) << bad;
  }
}

TEST(ConfigEnums, GoBool) {
  for (const char* t : {"1", "t", "T", "TRUE", "true", "True", "yes", "ON"}) {
    auto b = ParseGoBool(t);
    ASSERT_TRUE(b.ok()) << t;
    EXPECT_TRUE(*b) << t;
  }
  for (const char* f : {"0", "f", "F", "FALSE", "false", "False", "no", "off"}) {
    auto b = ParseGoBool(f);
    ASSERT_TRUE(b.ok()) << f;
    EXPECT_FALSE(*b) << f;
  }
  EXPECT_EQ(ParseGoBool("tRuE").status().message(), "invalid value \"tRuE\" (want true|false)");
  EXPECT_FALSE(ParseGoBool("").ok());
  EXPECT_EQ(*ParseSharedDevicesAllocationPolicy("distributed"), "distributed");
  EXPECT_FALSE(ParseSharedDevicesAllocationPolicy("Packed").ok());
}

TEST(Config, LoadMissingFileIsNotFound) {
  auto c = LoadConfigFile("/nonexistent/gpulet-config.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(c.status().message().find("/nonexistent/gpulet-config.yaml"), std::string::npos);
}

TEST(Config, TooLargeRejected) {
  std::string big = "version: v1\n" + std::string(2 << 20, '#');
  auto c = ParseConfig(big, "big.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("big.yaml:1: config is larger than 1 MiB"),
            std::string::npos);
}

TEST(Config, DeepNestingIsAnErrorNotACrash) {
  std::string deep = "flags: " + std::string(100000, '[') + std::string(100000, ']') + "\n";
  auto c = ParseConfig(deep, "deep.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), ErrorCode::kInvalidInput);
  EXPECT_EQ(c.status().message().rfind("deep.yaml:1: invalid YAML: nested more than", 0), 0u)
      << c.status().message();
}

// yaml-cpp 0.7's LoadAll loops forever on "," (yaml-cpp #1040); found by config_fuzz.
TEST(Config, LoneCommaIsAnErrorNotAHang) {
  for (const char* text : {",", ", a", "version: v1\n---\n,\n"}) {
    auto c = ParseConfig(text, "comma.yaml");
    EXPECT_FALSE(c.ok() && c->flags.mig_strategy) << text;
  }
  EXPECT_FALSE(ParseConfig(",", "comma.yaml").ok());
}

TEST(Config, TrailingEmptyDocumentAccepted) {
  auto c = ParseConfig("version: v1\nflags: {migStrategy: mixed}\n---\n", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->flags.mig_strategy, MigStrategy::kMixed);
}

struct EnumCase {
  std::string text;
  bool ok;
};

TEST(ConfigEnums, MigStrategy) {
  for (auto [text, ok] : std::vector<EnumCase>{
           {"none", true}, {"single", true}, {"mixed", true}, {"Mixed", false}, {"", false}}) {
    auto r = ParseMigStrategy(text);
    EXPECT_EQ(r.ok(), ok) << text;
    if (ok) {
      EXPECT_EQ(MigStrategyName(*r), text);
    }
  }
  EXPECT_EQ(ParseMigStrategy("x").status().message(),
            "invalid value \"x\" (want none|single|mixed)");
}

TEST(ConfigEnums, DeviceIdStrategy) {
  EXPECT_EQ(*ParseDeviceIdStrategy("uuid"), DeviceIdStrategy::kUuid);
  EXPECT_EQ(*ParseDeviceIdStrategy("index"), DeviceIdStrategy::kIndex);
  EXPECT_FALSE(ParseDeviceIdStrategy("UUID").ok());
  EXPECT_STREQ(DeviceIdStrategyName(DeviceIdStrategy::kIndex), "index");
}

TEST(ConfigEnums, DeviceListStrategies) {
  auto r = ParseDeviceListStrategies("envvar, volume-mounts,cdi-annotations,cdi-cri");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->size(), 4u);
  EXPECT_STREQ(DeviceListStrategyName((*r)[1]), "volume-mounts");
  EXPECT_FALSE(ParseDeviceListStrategies("").ok());
  EXPECT_FALSE(ParseDeviceListStrategies("envvar,").ok());
  // Upstream keeps a set: a repeated name counts once.
  EXPECT_EQ(*ParseDeviceListStrategies("envvar,envvar"), std::vector{DeviceListStrategy::kEnvvar});
  EXPECT_FALSE(ParseDeviceListStrategies("cdi").ok());
}

TEST(ConfigFlags, OverlayAppliesPrecedence) {
  Flags file, env, cli;
  file.mig_strategy = MigStrategy::kMixed;
  file.fail_on_init_error = true;
  file.plugin.device_id_strategy = DeviceIdStrategy::kIndex;
  file.nvidia_driver_root = "/file";
  env.nvidia_driver_root = "/env";
  env.plugin.pass_device_specs = false;
  cli.plugin.pass_device_specs = true;
  cli.mig_strategy = MigStrategy::kNone;
  Flags f = Overlay(Overlay(file, env), cli);
  EXPECT_EQ(f.mig_strategy, MigStrategy::kNone);
  EXPECT_EQ(f.fail_on_init_error, true);
  EXPECT_EQ(f.plugin.device_id_strategy, DeviceIdStrategy::kIndex);
  EXPECT_EQ(f.nvidia_driver_root, "/env");
  EXPECT_EQ(f.plugin.pass_device_specs, true);
  EXPECT_FALSE(f.plugin.device_list_strategy);
}

TEST(ConfigErrors, InvalidAtFormat) {
  Status s = InvalidAt(SourceLocation{"c.yaml", 14, "sharing.timeSlicing.resources[0].devices[1]"},
                       "unknown device \"7\"");
  EXPECT_EQ(s.code(), ErrorCode::kInvalidInput);
  EXPECT_EQ(s.message(),
            "c.yaml:14: sharing.timeSlicing.resources[0].devices[1]: unknown device \"7\"");
}

}  // namespace
}  // namespace gpulet::config

namespace gpulet::config {
namespace {

TEST(MemoryPoolConfig, DefaultsAndNames) {
  Result<Config> c = ParseConfig(
      "version: v1\nsharing:\n  memory:\n    resources:\n    - name: gpu\n      devices: [0, 1]\n",
      "m.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_TRUE(c->sharing.memory.has_value());
  const MemoryPool& m = *c->sharing.memory;
  EXPECT_EQ(m.unit_bytes, uint64_t{1} << 30);
  EXPECT_EQ(m.advertised_name, "gpulet.io/gpu-memory-1gi");
  EXPECT_EQ(m.placement, MemoryPlacement::kBestFit);
  ASSERT_EQ(m.resources.size(), 1u);
  EXPECT_EQ(m.resources[0].name, "nvidia.com/gpu");
  EXPECT_EQ(m.resources[0].devices.list.size(), 2u);
  EXPECT_EQ(m.resources[0].where.field, "sharing.memory.resources[0]");
  EXPECT_TRUE(c->warnings.empty());
}

TEST(MemoryPoolConfig, UnitPlacementRename) {
  Result<Config> c = ParseConfig(
      "sharing:\n  memory:\n    unit: 512Mi\n    placement: spread\n    resources:\n"
      "    - name: nvidia.com/gpu\n",
      "m.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->sharing.memory->unit_bytes, uint64_t{512} << 20);
  EXPECT_EQ(c->sharing.memory->advertised_name, "gpulet.io/gpu-memory-512mi");
  EXPECT_EQ(c->sharing.memory->placement, MemoryPlacement::kSpread);
  c = ParseConfig(
      "sharing:\n  memory:\n    unit: 2Gi\n    rename: example.com/vram\n    resources:\n"
      "    - name: gpu\n",
      "m.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->sharing.memory->advertised_name, "example.com/vram");
  EXPECT_EQ(UnitQuantity(uint64_t{1} << 30), "1Gi");
  EXPECT_EQ(UnitQuantity(uint64_t{3} << 29), "1536Mi");
  EXPECT_EQ(UnitQuantity(uint64_t{1} << 40), "1Ti");
  EXPECT_EQ(DefaultMemoryResourceName(uint64_t{2} << 30), "gpulet.io/gpu-memory-2gi");
}

TEST(MemoryPoolConfig, ErrorsNameFileLineField) {
  struct Case {
    const char* yaml;
    const char* want;
  } cases[] = {
      {"sharing:\n  memory:\n    unit: 1000\n    resources:\n    - name: gpu\n",
       "m.yaml:3: sharing.memory.unit: must be a multiple of 1Mi"},
      {"sharing:\n  memory:\n    unit: lots\n    resources:\n    - name: gpu\n",
       "m.yaml:3: sharing.memory.unit: must be a multiple of 1Mi"},
      {"sharing:\n  memory:\n    placement: packed\n    resources:\n    - name: gpu\n",
       "m.yaml:3: sharing.memory.placement: invalid value \"packed\" (want best-fit|spread)"},
      {"sharing:\n  memory:\n    unit: 1Gi\n", "sharing.memory.resources: at least one resource"},
      {"sharing:\n  memory:\n    resources:\n    - name: mig-1g.10gb\n",
       "m.yaml:4: sharing.memory.resources[0].name: the memory pool takes whole GPUs"},
      {"sharing:\n  memory:\n    resources:\n    - devices: all\n",
       "sharing.memory.resources[0].name: required"},
      {"sharing:\n  memory:\n    rename: nvidia.com/gpu\n    resources:\n    - name: gpu\n",
       "m.yaml:3: sharing.memory.rename: \"nvidia.com/gpu\" clashes"},
      {"sharing:\n  memory:\n    rename: vram\n    resources:\n    - name: gpu\n",
       "m.yaml:3: sharing.memory.rename: invalid resource name \"vram\""},
      {"sharing:\n  memory:\n    resources:\n    - name: gpu\n    - name: gpu\n      devices: "
       "[1]\n",
       "sharing.memory.resources[1].devices: overlaps the devices of sharing.memory.resources[0]"},
  };
  for (const Case& c : cases) {
    Result<Config> r = ParseConfig(c.yaml, "m.yaml");
    ASSERT_FALSE(r.ok()) << c.yaml;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidInput);
    EXPECT_NE(r.status().message().find(c.want), std::string::npos)
        << r.status().message() << "\nwant: " << c.want;
  }
}

}  // namespace
}  // namespace gpulet::config
