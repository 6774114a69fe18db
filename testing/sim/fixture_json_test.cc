#include "sim/fixture_json.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "sim/simulation.h"

namespace gpulet::sim {
namespace {

namespace fs = std::filesystem;

// Every field a fixture can set, so that a field the JSON form forgets shows up.
constexpr const char* kEveryField = R"(name: every-field
driver_version: 550.54.15
cuda_version: 12040
seed: 7
numa_nodes:
  - cpus: 0-3
  - cpus: 4-7
cpu_topology: {sockets: 2, cores_per_socket: 2, threads_per_core: 2, numbering: alternating}
mig_profiles:
  1g.10gb: {slices: 1, memory_mb: 9984, sms: 16}
  3g.40gb: {slices: 3, memory_mb: 40192, sms: 60}
defaults:
  name: NVIDIA H100 80GB HBM3
  memory_mib: 81559
  compute_capability: "9.0"
  architecture: hopper
  sm_count: 132
  mig_capable: true
gpus:
  - bus_id: "0000:18:00.0"
    numa: 0
    pcie_switch: 1
    mig: [{profile: 3g.40gb, gi: 2, ci: 0, placement: 4}]
    processes: [{pid: 4242, memory_mib: 2048, sm_util: 30, mem_util: 10, gi: 2, ci: 0}]
  - {bus_id: "0000:2a:00.0", numa: 1, power_limit_w: 350, processes: [{pid: 7, memory_mib: 1}]}
nvlink: {pairs: [[0, 1, 12]]}
)";

Fixture MustParse(const std::string& text) {
  Result<Fixture> f = ParseFixture(text, "every-field.yaml");
  EXPECT_TRUE(f.ok()) << f.status().message();
  return f.ok() ? *f : Fixture{};
}

TEST(FixtureJsonTest, EveryBuiltinFixtureAndEveryFieldSurviveTheRoundTrip) {
  std::vector<Fixture> fixtures = {MustParse(kEveryField)};
  for (const std::string& name : BuiltinFixtureNames()) {
    Result<std::string> path = ResolveFixture(name);
    ASSERT_TRUE(path.ok()) << path.status().message();
    Result<Fixture> f = LoadFixture(*path);
    ASSERT_TRUE(f.ok()) << f.status().message();
    fixtures.push_back(*f);
  }
  ASSERT_GE(fixtures.size(), 6u);
  for (const Fixture& f : fixtures) {
    const nlohmann::json j = FixtureToJson(f);
    Result<Fixture> back = FixtureFromJson(nlohmann::json::parse(j.dump()));
    ASSERT_TRUE(back.ok()) << f.name << ": " << back.status().message();
    EXPECT_EQ(FixtureToJson(*back), j) << f.name;
    EXPECT_EQ(back->gpus.size(), f.gpus.size()) << f.name;
    EXPECT_EQ(back->nvlinks, f.nvlinks) << f.name;
  }
  // Spot checks on the field-rich one, through the structs (not only through the JSON form).
  Result<Fixture> every = FixtureFromJson(FixtureToJson(fixtures[0]));
  ASSERT_TRUE(every.ok());
  ASSERT_EQ(every->gpus.size(), 2u);
  EXPECT_EQ(every->seed, 7u);
  ASSERT_TRUE(every->cpu_topology.has_value());
  EXPECT_TRUE(every->cpu_topology->alternating);
  EXPECT_EQ(every->numa_cpus, (std::vector<std::string>{"0-3", "4-7"}));
  EXPECT_EQ(every->mig_profiles.at("3g.40gb").memory_mb, 40192u);
  ASSERT_EQ(every->gpus[0].mig.size(), 1u);
  EXPECT_EQ(every->gpus[0].mig[0].uuid, fixtures[0].gpus[0].mig[0].uuid);
  EXPECT_EQ(every->gpus[0].mig[0].facts.sms, 60u);
  EXPECT_EQ(every->gpus[0].processes, fixtures[0].gpus[0].processes);
  EXPECT_EQ(every->gpus[0].pcie_switch, 1);
  EXPECT_EQ(every->gpus[1].power_limit_w, 350u);
  EXPECT_EQ(every->gpus[1].uuid, fixtures[0].gpus[1].uuid);
  EXPECT_EQ(every->nvlinks[0][1], 12u);
}

TEST(FixtureJsonTest, AMissingOrMistypedFieldIsNamed) {
  nlohmann::json j = FixtureToJson(MustParse(kEveryField));
  j["gpus"][0].erase("memory_mib");
  Result<Fixture> missing = FixtureFromJson(j);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("memory_mib"), std::string::npos)
      << missing.status().message();
  j = FixtureToJson(MustParse(kEveryField));
  j["cuda_version"] = "twelve";
  EXPECT_FALSE(FixtureFromJson(j).ok());
}

class ParsedCopyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "parsed-copy-" + std::to_string(::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_ + "/state");
    yaml_ = dir_ + "/every-field.yaml";
    Write(yaml_, kEveryField);
  }
  void TearDown() override { fs::remove_all(dir_); }
  static void Write(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::trunc) << text;
  }
  std::string dir_, yaml_;
};

TEST_F(ParsedCopyTest, ACopyIsUsedOnlyForItsFileWhileTheFileHoldsTheSameText) {
  const Fixture f = MustParse(kEveryField);
  const std::string state = dir_ + "/state";
  EXPECT_FALSE(ReadParsedFixture(yaml_, kEveryField, state).has_value()) << "no copy yet";
  ASSERT_TRUE(WriteParsedFixture(f, yaml_, kEveryField, state).ok());
  std::optional<Fixture> read = ReadParsedFixture(yaml_, kEveryField, state);
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(FixtureToJson(*read), FixtureToJson(f));
  // Another file with the same text: not this copy's.
  EXPECT_FALSE(ReadParsedFixture(dir_ + "/other.yaml", kEveryField, state).has_value());
  // The file changed (one byte): stale.
  const std::string changed = std::string(kEveryField) + "#\n";
  Write(yaml_, changed);
  ASSERT_EQ(ReadFixtureText(yaml_), changed);
  EXPECT_FALSE(ReadParsedFixture(yaml_, changed, state).has_value());
  // The file is gone: no text to compare with.
  fs::remove(yaml_);
  EXPECT_FALSE(ReadFixtureText(yaml_).has_value());
}

TEST_F(ParsedCopyTest, ACorruptOrForeignCopyIsIgnored) {
  const std::string state = dir_ + "/state";
  for (const std::string& junk : {std::string(""), std::string("{\"source\": 1}"),
                                  std::string("not json"), std::string("[]"),
                                  "{\"source\": \"" + yaml_ + "\", \"text\": \"x\"}"}) {
    Write(ParsedFixturePath(state), junk);
    EXPECT_FALSE(ReadParsedFixture(yaml_, kEveryField, state).has_value()) << junk;
  }
  // The right source and text, but a fixture that does not parse.
  nlohmann::json doc = {{"source", yaml_}, {"text", kEveryField}, {"fixture", {{"name", 1}}}};
  Write(ParsedFixturePath(state), doc.dump());
  EXPECT_FALSE(ReadParsedFixture(yaml_, kEveryField, state).has_value());
}

TEST_F(ParsedCopyTest, PrepareSimulationWritesTheCopyTheDriverReads) {
  Result<SimulatedNode> node = PrepareSimulation(yaml_, dir_ + "/sim");
  ASSERT_TRUE(node.ok()) << node.status().message();
  std::optional<Fixture> read = ReadParsedFixture(yaml_, kEveryField, node->state_dir);
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->name, "every-field");
  EXPECT_EQ(read->gpus.size(), 2u);
}

}  // namespace
}  // namespace gpulet::sim
