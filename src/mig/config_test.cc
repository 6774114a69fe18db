#include "mig/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gpulet::mig {
namespace {

using ::testing::HasSubstr;

constexpr const char* kFile = R"(version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-1g.5gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.5gb": 7
  mixed:
    - devices: [0, 1]
      mig-enabled: true
      mig-devices:
        "3g.20gb": 1
        "2g.10gb": 1
        "1g.5gb": 2
    - devices: [2]
      mig-enabled: false
)";

TEST(ParseMigConfig, ReadsAllDevicesAndCounts) {
  Result<MigConfig> c = ParseMigConfig(kFile, "mig.yaml", "all-1g.5gb");
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_EQ(c->entries.size(), 1u);
  EXPECT_FALSE(c->entries[0].devices.has_value());
  EXPECT_TRUE(c->entries[0].mig_enabled);
  ASSERT_EQ(c->entries[0].mig_devices.size(), 1u);
  EXPECT_EQ(c->entries[0].mig_devices[0].first, "1g.5gb");
  EXPECT_EQ(c->entries[0].mig_devices[0].second, 7u);
}

TEST(ParseMigConfig, ReadsSeveralEntriesWithDeviceLists) {
  Result<MigConfig> c = ParseMigConfig(kFile, "mig.yaml", "mixed");
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_EQ(c->entries.size(), 2u);
  EXPECT_EQ(*c->entries[0].devices, (std::vector<unsigned>{0, 1}));
  EXPECT_EQ(c->entries[0].mig_devices.size(), 3u);
  EXPECT_EQ(c->entries[0].mig_devices[1].first, "2g.10gb");  // file order
  EXPECT_EQ(*c->entries[1].devices, (std::vector<unsigned>{2}));
  EXPECT_FALSE(c->entries[1].mig_enabled);
  EXPECT_EQ(c->entries[1].line, 18);
  EXPECT_EQ(c->entries[0].mig_devices_line, 14);
  EXPECT_EQ(c->entries[1].mig_devices_line, 18);  // none: the entry's line
}

// mig-parted's own shapes: device-filter (one id or a list), several `devices: all` entries with
// different filters, profile suffixes and compute-instance profiles; unknown keys warn.
TEST(ParseMigConfig, MigPartedShapes) {
  constexpr const char* kText = R"(version: v1
mig-configs:
  c:
    - device-filter: ["0x233010DE", "0x20b210de"]
      devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb+me": 1, "1c.3g.40gb": 2, "1g.24gb+gfx": 1, "1g.24gb+me.all": 1, "1g.24gb-me": 1}
    - device-filter: "0x20B010DE"
      devices: all
      mig-enabled: true
      mig-devices: {}
      colour: blue
)";
  Result<MigConfig> c = ParseMigConfig(kText, "mp.yaml", "c");
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_EQ(c->entries.size(), 2u);
  EXPECT_EQ(c->entries[0].device_filter, (std::vector<uint32_t>{0x20B210DE, 0x233010DE}));
  EXPECT_EQ(c->entries[1].device_filter, (std::vector<uint32_t>{0x20B010DE}));
  EXPECT_TRUE(c->entries[1].mig_enabled);
  EXPECT_TRUE(c->entries[1].mig_devices.empty());
  EXPECT_EQ(c->entries[0].mig_devices.size(), 5u);
  ASSERT_EQ(c->warnings.size(), 1u);
  EXPECT_THAT(c->warnings[0], HasSubstr("mp.yaml:12: mig-configs.c[1].colour: unknown key"));
  EXPECT_EQ(GpuInstanceProfileOf("1c.3g.40gb"), "3g.40gb");
  EXPECT_EQ(ComputeSlicesOf("1c.3g.40gb"), 1u);
  EXPECT_EQ(GpuInstanceProfileOf("1g.10gb+me"), "1g.10gb+me");
  EXPECT_EQ(ComputeSlicesOf("7g.80gb"), 0u);
}

TEST(ParseMigConfig, UnknownConfigNameListsTheKnownOnes) {
  Result<MigConfig> c = ParseMigConfig(kFile, "mig.yaml", "nope");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), ErrorCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr("all-disabled, all-1g.5gb, mixed"));
}

struct BadCase {
  const char* text;
  const char* expected;  // substring of the error
};

class ParseMigConfigErrors : public ::testing::TestWithParam<BadCase> {};

TEST_P(ParseMigConfigErrors, NameFileLineAndField) {
  Result<MigConfig> c = ParseMigConfig(GetParam().text, "bad.yaml", "c");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), ErrorCode::kInvalidInput);
  EXPECT_THAT(c.status().message(), HasSubstr(GetParam().expected));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ParseMigConfigErrors,
    ::testing::Values(
        BadCase{"version: v2\nmig-configs: {c: []}\n", "bad.yaml:1: version: unsupported"},
        BadCase{"mig-configs: {c: []}\n", "version: required"},
        BadCase{"version: v1\nmig-configs:\n  c:\n    - devices: all\n",
                "bad.yaml:4: mig-configs.c[0].mig-enabled: required"},
        BadCase{"version: v1\nmig-configs:\n  c:\n    - devices: some\n      mig-enabled: true\n",
                "bad.yaml:4: mig-configs.c[0].devices: expected \"all\" or a list"},
        BadCase{"version: v1\nmig-configs:\n  c:\n    - devices: [0, 0]\n      mig-enabled: true\n",
                "mig-configs.c[0].devices[1]: GPU 0 listed twice"},
        BadCase{"version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: yes\n",
                "bad.yaml:5: mig-configs.c[0].mig-enabled: expected true or false"},
        BadCase{"version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: true\n",
                "bad.yaml:4: mig-configs.c[0].mig-devices: required with mig-enabled: true"},
        BadCase{"version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: true\n"
                "      mig-devices: {\"1g.10gb+tv\": 2}\n",
                "bad.yaml:6: mig-configs.c[0].mig-devices.1g.10gb+tv: expected a MIG profile name"},
        BadCase{"version: v1\nmig-configs:\n  c:\n    - device-filter: 0xZZ\n      devices: all\n"
                "      mig-enabled: false\n",
                "bad.yaml:4: mig-configs.c[0].device-filter: expected a PCI device id"},
        BadCase{
            "version: v1\nmig-configs:\n  c:\n    - device-filter: [\"0x20B010DE\"]\n"
            "      devices: all\n      mig-enabled: false\n"
            "    - device-filter: \"0x20b010de\"\n      devices: [1]\n      mig-enabled: false\n",
            "mig-configs.c[1].devices: \"all\" overlaps"},
        BadCase{"version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: true\n"
                "      mig-devices: {\"big\": 2}\n",
                "mig-devices.big: expected a MIG profile name"},
        BadCase{"version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: true\n"
                "      mig-devices: {\"1g.5gb\": -1}\n",
                "mig-devices.1g.5gb: expected a non-negative integer"},
        BadCase{"version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: false\n"
                "      mig-devices: {\"1g.5gb\": 1}\n",
                "mig-devices: given with mig-enabled: false"},
        BadCase{"version: v1\nmig-configs:\n  c:\n    - devices: [0, 1]\n      mig-enabled: false\n"
                "    - devices: [1]\n      mig-enabled: false\n",
                "bad.yaml:6: mig-configs.c[1].devices: GPU 1 is already configured"},
        BadCase{"version: v1\nmig-configs:\n  c:\n    - devices: [0]\n      mig-enabled: false\n"
                "    - devices: all\n      mig-enabled: false\n",
                "mig-configs.c[1].devices: \"all\" overlaps"},
        BadCase{"version: v1\nmig-configs: [\n", "bad.yaml:"}));

}  // namespace
}  // namespace gpulet::mig
