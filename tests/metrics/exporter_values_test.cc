// The exposition's values, checked against numbers the test computes itself: the fixture file
// read directly (GPU count, model, PCI addresses, memory size, clocks, driver version) and the
// telemetry the test sets through `gpulet sim set`. The goldens (exporter_test.cc) mask every
// value; this is what catches a wrong number.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cctype>
#include <map>
#include <regex>
#include <string>

#include "process.h"

namespace gpulet::testing {
namespace {

struct Sample {
  std::map<std::string, std::string> labels;
  double value = 0;
};

// family → gpu index → sample (whole-GPU series only: those without a GPU_I_ID label).
std::map<std::string, std::map<int, Sample>> Parse(const std::string& text) {
  std::map<std::string, std::map<int, Sample>> out;
  std::istringstream in(text);
  std::string line;
  const std::regex series(R"(^([A-Za-z_:][A-Za-z0-9_:]*)\{(.*)\} (\S+)$)");
  const std::regex label(R"re(([A-Za-z_][A-Za-z0-9_]*)="([^"]*)")re");
  while (std::getline(in, line)) {
    std::smatch m;
    if (line.empty() || line[0] == '#' || !std::regex_match(line, m, series)) continue;
    Sample s;
    const std::string labels = m[2];
    for (std::sregex_iterator it(labels.begin(), labels.end(), label), end; it != end; ++it) {
      s.labels[(*it)[1]] = (*it)[2];
    }
    if (!s.labels.count("gpu") || s.labels.count("GPU_I_ID")) continue;
    s.value = std::stod(m[3]);
    out[m[1]][std::stoi(s.labels["gpu"])] = s;
  }
  return out;
}

// "0000:18:00.0" as NVML prints it: an 8-digit domain, upper case.
std::string NvmlBusId(std::string bus) {
  for (char& c : bus) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (bus.find(':') == 4) bus = "0000" + bus;
  return bus;
}

class ExporterValues : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("gpulet-exporter-values");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override {
    exporter_.Stop();
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }
  std::string GlobalFlags() const {
    return Gpulet() + " --simulate " + GetParam() + " --sim-state " + dir_ + "/sim";
  }
  std::string dir_;
  Child exporter_;
};

TEST_P(ExporterValues, MatchTheFixtureAndTheTelemetrySet) {
  const std::string fixture_path =
      std::string(GPULET_SOURCE_DIR) + "/testing/fixtures/" + GetParam() + ".yaml";
  const YAML::Node fx = YAML::LoadFile(fixture_path);
  const YAML::Node defaults = fx["defaults"];
  const size_t gpus = fx["gpus"].size();
  ASSERT_GE(gpus, 1u);
  const unsigned target = static_cast<unsigned>(gpus - 1);  // the last GPU gets set values

  // Values of our own choosing, set before the exporter starts.
  const std::string set = GlobalFlags() + " sim set --gpu " + std::to_string(target) +
                          " --temperature 77 --gpu-util 42 --mem-util 13 --power 61 "
                          "--memory-used 12345";
  ASSERT_EQ(std::system((set + " >/dev/null").c_str()), 0) << set;

  std::vector<std::string> argv = {Gpulet(),      "--simulate", GetParam(),   "--sim-state",
                                   dir_ + "/sim", "exporter",   "--hostname", "node-v",
                                   "-c",          "200",        "-a",         "127.0.0.1:0"};
  ASSERT_TRUE(exporter_.Start(argv, dir_ + "/exporter.log"));
  const int port = WaitServing(exporter_);
  ASSERT_NE(port, 0) << exporter_.log();
  std::map<std::string, std::map<int, Sample>> m;
  ASSERT_TRUE(WaitFor([&] {
    m = Parse(HttpGet(port, "/metrics"));
    return m["DCGM_FI_DEV_GPU_TEMP"].size() == gpus && m["DCGM_FI_DEV_FB_USED"].size() == gpus;
  })) << exporter_.log();

  const std::string model = defaults["name"].as<std::string>();
  const double memory_mib = defaults["memory_mib"].as<double>();
  for (size_t i = 0; i < gpus; ++i) {
    SCOPED_TRACE("gpu " + std::to_string(i));
    const Sample& temp = m["DCGM_FI_DEV_GPU_TEMP"][static_cast<int>(i)];
    const YAML::Node g = fx["gpus"][i];
    EXPECT_EQ(temp.labels.at("modelName"), g["name"] ? g["name"].as<std::string>() : model);
    EXPECT_EQ(temp.labels.at("pci_bus_id"), NvmlBusId(g["bus_id"].as<std::string>()));
    EXPECT_EQ(temp.labels.at("Hostname"), "node-v");
    // Framebuffer: used + free + reserved is the card's memory, in MiB.
    const double fb = m["DCGM_FI_DEV_FB_USED"][static_cast<int>(i)].value +
                      m["DCGM_FI_DEV_FB_FREE"][static_cast<int>(i)].value +
                      m["DCGM_FI_DEV_FB_RESERVED"][static_cast<int>(i)].value;
    EXPECT_NEAR(fb, memory_mib, 1.0);
    if (defaults["mem_clock_mhz"]) {
      EXPECT_EQ(m["DCGM_FI_DEV_MEM_CLOCK"][static_cast<int>(i)].value,
                defaults["mem_clock_mhz"].as<double>());
    }
    if (defaults["max_sm_clock_mhz"]) {
      EXPECT_LE(m["DCGM_FI_DEV_SM_CLOCK"][static_cast<int>(i)].value,
                defaults["max_sm_clock_mhz"].as<double>());
    }
    if (defaults["power_limit_w"]) {
      EXPECT_LE(m["DCGM_FI_DEV_POWER_USAGE"][static_cast<int>(i)].value,
                defaults["power_limit_w"].as<double>());
    }
    EXPECT_EQ(m["DCGM_FI_DEV_XID_ERRORS"][static_cast<int>(i)].value, 0);
    EXPECT_EQ(m["gpulet_gpu_up"][static_cast<int>(i)].value, 1);
  }
  const int t = static_cast<int>(target);
  EXPECT_EQ(m["DCGM_FI_DEV_GPU_TEMP"][t].value, 77);
  EXPECT_EQ(m["DCGM_FI_DEV_GPU_UTIL"][t].value, 42);
  EXPECT_EQ(m["DCGM_FI_DEV_MEM_COPY_UTIL"][t].value, 13);
  EXPECT_NEAR(m["DCGM_FI_DEV_POWER_USAGE"][t].value, 61, 0.5);
  EXPECT_EQ(m["DCGM_FI_DEV_FB_USED"][t].value, 12345);
  // The driver version label, where present, is the fixture's.
  const auto& temp = m["DCGM_FI_DEV_GPU_TEMP"][0].labels;
  if (temp.count("DCGM_FI_DRIVER_VERSION")) {
    EXPECT_EQ(temp.at("DCGM_FI_DRIVER_VERSION"), fx["driver_version"].as<std::string>());
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ExporterValues, ::testing::Values("dgx-h100", "l4-pcie"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace gpulet::testing
