// The parsed form of a fixture, as JSON: what the simulated driver library reads.
//
// The simulated libnvidia-ml.so.1 is loaded into `gpulet`, which carries its own C++ runtime and
// yaml-cpp (GPULET_STATIC_CXX). Parsing the YAML in the library would load the shared libstdc++
// and yaml-cpp into every simulated agent, 2 MiB resident that a real node (whose driver is a C
// library) never has. So whoever prepares a simulation (PrepareSimulation, in `gpulet --simulate`
// and the tests) writes the parsed fixture beside the state (<state dir>/fixture.json), and the
// library reads that; the copy records the YAML text it came from and is used only while the file
// still holds that text. Without a current copy the library asks a helper library,
// libgpulet-sim-yaml.so, loaded on demand from its own directory, to parse the YAML.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "sim/fixture.h"

namespace gpulet::sim {

nlohmann::json FixtureToJson(const Fixture& fixture);
// Errors (kInvalidInput) name the field that is missing or of the wrong type.
Result<Fixture> FixtureFromJson(const nlohmann::json& j);

// <state_dir>/fixture.json.
std::string ParsedFixturePath(const std::string& state_dir);
// Writes the parsed copy of the fixture read from `source_path`, whose text was `source_text`.
Status WriteParsedFixture(const Fixture& fixture, const std::string& source_path,
                          const std::string& source_text, const std::string& state_dir);
// The parsed copy in `state_dir`, if there is one for `source_path` and it was parsed from
// `source_text`, the file's text now; nullopt otherwise (no copy, another fixture's, stale or
// unreadable).
std::optional<Fixture> ReadParsedFixture(const std::string& source_path,
                                         const std::string& source_text,
                                         const std::string& state_dir);

// The helper library's entry point (C ABI; libgpulet-sim-yaml.so, fixture_helper.cc): parses
// `text`, the fixture file `file` holds (named in errors), and returns, in memory from malloc that
// the caller frees, its JSON form (*ok = 1) or the error message (*ok = 0).
extern "C" typedef char* (*GpuletSimParseFixtureFn)(const char* text, const char* file, int* ok);
inline constexpr const char* kParseFixtureSymbol = "gpulet_sim_parse_fixture";
inline constexpr const char* kFixtureHelperLibrary = "libgpulet-sim-yaml.so";

}  // namespace gpulet::sim
