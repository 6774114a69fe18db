#include "metrics/counters.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "metrics/exposition.h"
#include "metrics/sampler.h"
#include "support/require.h"

namespace gpulet::metrics {
namespace {

std::string UpstreamCounters() {
  // shared/ sits beside the checkout, locally and in CI.
  return std::string(GPULET_SOURCE_DIR) + "/../shared/upstream/dcgm-exporter/default-counters.csv";
}

TEST(Counters, UpstreamDefaultCountersLoadUnchanged) {
  GPULET_REQUIRE_SHARED(UpstreamCounters());
  auto set = LoadCounters(UpstreamCounters());
  ASSERT_TRUE(set.ok()) << set.status().message();
  std::vector<std::string> names;
  for (const Counter& c : set->metrics) names.push_back(c.field);
  // Every readable row of the upstream file, in file order.
  std::vector<std::string> want = {"DCGM_FI_DEV_SM_CLOCK",
                                   "DCGM_FI_DEV_MEM_CLOCK",
                                   "DCGM_FI_DEV_MEMORY_TEMP",
                                   "DCGM_FI_DEV_GPU_TEMP",
                                   "DCGM_FI_DEV_POWER_USAGE",
                                   "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                                   "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
                                   "DCGM_FI_DEV_GPU_UTIL",
                                   "DCGM_FI_DEV_MEM_COPY_UTIL",
                                   "DCGM_FI_DEV_ENC_UTIL",
                                   "DCGM_FI_DEV_DEC_UTIL",
                                   "DCGM_FI_DEV_XID_ERRORS",
                                   "DCGM_FI_DEV_FB_FREE",
                                   "DCGM_FI_DEV_FB_USED",
                                   "DCGM_FI_DEV_FB_RESERVED",
                                   "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
                                   "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
                                   "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
                                   "DCGM_FI_DEV_ROW_REMAP_FAILURE",
                                   "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                                   "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                                   "DCGM_FI_PROF_DRAM_ACTIVE",
                                   "DCGM_FI_PROF_PCIE_TX_BYTES",
                                   "DCGM_FI_PROF_PCIE_RX_BYTES"};
  EXPECT_EQ(names, want);
  ASSERT_EQ(set->labels.size(), 1u);
  EXPECT_EQ(set->labels[0].field, "DCGM_FI_DRIVER_VERSION");
  // "DCGM_FI_DEV_DEC_UTIL ," in the upstream file: the name is trimmed.
  EXPECT_EQ(set->metrics[10].help, "Decoder utilization (in %).");
  EXPECT_EQ(set->metrics[5].type, PromType::kCounter);
  // Rows gpulet cannot read are skipped, each named once with its line: only the vGPU license
  // status (no vGPU on bare metal; dcgm-exporter leaves it blank there too).
  ASSERT_EQ(set->skipped.size(), 1u);
  EXPECT_NE(set->skipped[0].find(": DCGM_FI_DEV_VGPU_LICENSE_STATUS:"), std::string::npos)
      << set->skipped[0];
}

TEST(Counters, CommentsBlankLinesAndQuotedHelp) {
  auto set = ParseCounters(
      "# comment\n\n  \nDCGM_FI_DEV_GPU_TEMP,gauge,\"Temp, in C\"\r\n"
      "DCGM_FI_DRIVER_VERSION, label, Driver\n",
      "c.csv");
  ASSERT_TRUE(set.ok()) << set.status().message();
  ASSERT_EQ(set->metrics.size(), 1u);
  EXPECT_EQ(set->metrics[0].help, "Temp, in C");
  EXPECT_EQ(set->metrics[0].line, 4);
  EXPECT_EQ(set->labels.size(), 1u);
}

struct BadCase {
  const char* text;
  const char* want;
};

// dcgm-exporter's histogram and summary rows, and DCGM fields gpulet does not collect, are one
// warning each (the row skipped), not fatal to the file.
TEST(Counters, UncollectedRowsAreSkippedWithOneWarningEach) {
  auto set = ParseCounters(
      "DCGM_FI_DEV_GPU_TEMP, gauge, t\n"
      "DCGM_FI_PROF_NVLINK_L0_TX_BYTES, histogram, h\n"
      "DCGM_FI_DEV_POWER_USAGE, summary, s\n"
      "DCGM_FI_DEV_SOMETHING_NEW, gauge, n\n"
      "DCGM_EXP_P2P_STATUS, gauge, x\n",
      "c.csv");
  ASSERT_TRUE(set.ok()) << set.status().message();
  ASSERT_EQ(set->metrics.size(), 1u);
  EXPECT_EQ(set->metrics[0].field, "DCGM_FI_DEV_GPU_TEMP");
  ASSERT_EQ(set->skipped.size(), 4u);
  EXPECT_EQ(set->skipped[0].rfind("c.csv:2: DCGM_FI_PROF_NVLINK_L0_TX_BYTES: type histogram", 0),
            0u)
      << set->skipped[0];
  EXPECT_EQ(set->skipped[2].rfind("c.csv:4: DCGM_FI_DEV_SOMETHING_NEW: not collected", 0), 0u)
      << set->skipped[2];
}

TEST(Counters, ErrorsNameFileAndLine) {
  const BadCase cases[] = {
      {"# x\nGPU_TEMP, gauge, typo\n", "c.csv:2: GPU_TEMP: unknown DCGM field"},
      {"DCGM_FI_DEV_GPU_TEMP, gauge\n", "c.csv:1: malformed row: want 3 columns"},
      {"DCGM_FI_DEV_GPU_TEMP, gauge, a, b\n", "c.csv:1: malformed row: want 3 columns"},
      {"DCGM_FI_DEV_GPU_TEMP, histo, x\n", "c.csv:1: DCGM_FI_DEV_GPU_TEMP: unknown type \"histo\""},
      {"DCGM_FI_DEV_GPU_TEMP, gauge, \"x\n", "c.csv:1: malformed row: unterminated quote"},
      {"DCGM_FI_DEV_GPU_TEMP, gauge, x\n\nDCGM_FI_DEV_GPU_TEMP, gauge, y\n",
       "c.csv:3: DCGM_FI_DEV_GPU_TEMP: duplicate of line 1"},
      {"DCGM_FI_DEV_GPU_TEMP, label, x\n",
       "c.csv:1: DCGM_FI_DEV_GPU_TEMP: numeric field cannot be a label"},
      {"DCGM_FI_DRIVER_VERSION, gauge, x\n",
       "c.csv:1: DCGM_FI_DRIVER_VERSION: string field must be a label"},
      {", gauge, x\n", "c.csv:1: empty field name"},
  };
  for (const BadCase& c : cases) {
    auto set = ParseCounters(c.text, "c.csv");
    ASSERT_FALSE(set.ok()) << c.text;
    EXPECT_EQ(set.status().code(), ErrorCode::kInvalidInput);
    EXPECT_NE(set.status().message().find(c.want), std::string::npos)
        << "got: " << set.status().message() << "\nwant: " << c.want;
  }
}

TEST(Counters, MissingFileIsNotFound) {
  auto set = LoadCounters("/nonexistent/counters.csv");
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.status().code(), ErrorCode::kNotFound);
}

TEST(Counters, DefaultsCoverTheAlertRuleFields) {
  CounterSet set = DefaultCounters();
  EXPECT_EQ(set.skipped.size(), 0u);
  std::set<std::string> names;
  for (const Counter& c : set.metrics) names.insert(c.field);
  for (const char* f : {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_GPU_TEMP",
                        "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"}) {
    EXPECT_TRUE(names.count(f)) << f;
  }
}

TEST(Fields, EverySupportedFieldHasAUniqueName) {
  std::set<std::string_view> names;
  for (const FieldInfo& f : SupportedFields()) {
    EXPECT_TRUE(names.insert(f.name).second) << f.name;
    EXPECT_FALSE(IsKnownUnsupportedField(f.name)) << f.name << " is in both lists";
  }
}

// dcgm-exporter's DCGM_EXP_XID_ERRORS_COUNT: XIDs per code within --xid-count-window-size, one
// series per code (label xid); nothing when none arrived in the window.
TEST(XidCount, CountsPerCodeWithinTheWindow) {
  XidLog log;
  log.SetCountWindow(std::chrono::minutes(5));
  const XidLog::TimePoint t0{};
  log.Record(3, 79, t0 + std::chrono::minutes(1));
  log.Record(3, 13, t0 + std::chrono::minutes(2));
  log.Record(3, 13, t0 + std::chrono::minutes(3));
  log.Record(1, 48, t0 + std::chrono::minutes(3));
  EXPECT_EQ(log.CountsInWindow(3, t0 + std::chrono::minutes(4)),
            (std::map<uint64_t, int64_t>{{13, 2}, {79, 1}}));
  // Six minutes after the first: it has left the window.
  EXPECT_EQ(log.CountsInWindow(3, t0 + std::chrono::minutes(6) + std::chrono::seconds(1)),
            (std::map<uint64_t, int64_t>{{13, 2}}));
  EXPECT_TRUE(log.CountsInWindow(3, t0 + std::chrono::minutes(20)).empty());
  EXPECT_TRUE(log.CountsInWindow(0, t0 + std::chrono::minutes(4)).empty());
  EXPECT_EQ(log.Last(3), 13u);
}

TEST(XidCount, OneSeriesPerCodeWithTheXidLabel) {
  auto set = ParseCounters("DCGM_EXP_XID_ERRORS_COUNT, gauge, reported XIDs during last window\n",
                           "c.csv");
  ASSERT_TRUE(set.ok()) << set.status().message();
  ASSERT_EQ(set->metrics.size(), 1u);
  EXPECT_TRUE(set->skipped.empty());
  Snapshot s;
  s.counters = std::make_shared<const CounterSet>(std::move(set).value());
  s.hostname = "n1";
  for (unsigned i = 0; i < 2; ++i) {
    EntitySample e;
    e.key = {i, -1};
    e.gpu = {i, "GPU-" + std::to_string(i), "00000000:1" + std::to_string(i) + ":00.0", "H100"};
    if (i == 1) {
      e.xid_counts = {{13, 2}, {79, 1}};
      e.values = {Value::Int(3)};
    } else {
      e.values = {std::nullopt};  // none in the window: no series
    }
    s.entities.push_back(e);
  }
  const std::string got = Render(s, {}, {});
  EXPECT_NE(
      got.find("DCGM_EXP_XID_ERRORS_COUNT{gpu=\"1\",UUID=\"GPU-1\",pci_bus_id=\"00000000:11:00.0\","
               "device=\"nvidia1\",modelName=\"H100\",Hostname=\"n1\",xid=\"13\"} 2\n"),
      std::string::npos)
      << got;
  EXPECT_NE(got.find(",xid=\"79\"} 1\n"), std::string::npos) << got;
  EXPECT_EQ(got.find("gpu=\"0\""), std::string::npos) << got;
}

}  // namespace
}  // namespace gpulet::metrics
