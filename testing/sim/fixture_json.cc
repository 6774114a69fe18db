#include "sim/fixture_json.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "sim/simulation.h"

namespace gpulet::sim {

// The per-profile, per-device and per-process records map field for field (the JSON keys are the
// member names); a missing key is an error naming it (json::at).
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(MigProfile, slices, memory_mb, sms, id, placements,
                                   placement_size)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(MigDeviceSpec, profile, gi, ci, placement, uuid, facts)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(SimProcess, pid, memory_mib, sm_util, mem_util, gi, ci)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(GpuSpec, index, name, uuid, domain, bus, device, function, minor,
                                   memory_mib, cc_major, cc_minor, architecture, sm_count,
                                   pci_device_id, pci_subsystem_id, numa, pcie_switch,
                                   power_limit_w, idle_power_w, max_sm_clock_mhz, mem_clock_mhz,
                                   mig_capable, mig, mig_mode, processes)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Fixture::CpuTopology, sockets, cores_per_socket,
                                   threads_per_core, alternating)

using nlohmann::json;

json FixtureToJson(const Fixture& f) {
  json out = {{"path", f.path},
              {"name", f.name},
              {"driver_version", f.driver_version},
              {"cuda_version", f.cuda_version},
              {"seed", f.seed},
              {"init_error", f.init_error ? json(*f.init_error) : json(nullptr)},
              {"numa_cpus", f.numa_cpus},
              {"cpu_topology", f.cpu_topology ? json(*f.cpu_topology) : json(nullptr)},
              {"mig_profiles", f.mig_profiles},
              {"gpus", f.gpus},
              {"nvlinks", f.nvlinks},
              {"nvswitch_links", f.nvswitch_links}};
  return out;
}

Result<Fixture> FixtureFromJson(const json& j) {
  try {
    Fixture f;
    j.at("path").get_to(f.path);
    j.at("name").get_to(f.name);
    j.at("driver_version").get_to(f.driver_version);
    j.at("cuda_version").get_to(f.cuda_version);
    j.at("seed").get_to(f.seed);
    if (!j.at("init_error").is_null()) f.init_error = j.at("init_error").get<int>();
    j.at("numa_cpus").get_to(f.numa_cpus);
    if (const json& t = j.at("cpu_topology"); !t.is_null()) {
      f.cpu_topology = t.get<Fixture::CpuTopology>();
    }
    j.at("mig_profiles").get_to(f.mig_profiles);
    j.at("gpus").get_to(f.gpus);
    j.at("nvlinks").get_to(f.nvlinks);
    j.at("nvswitch_links").get_to(f.nvswitch_links);
    return f;
  } catch (const nlohmann::json::exception& e) {
    return Status(ErrorCode::kInvalidInput, std::string("parsed fixture: ") + e.what());
  }
}

// Declared in simulation.h; here so that the driver library, which needs it, does not link the
// simulation's setup (and its YAML parser).
std::string DefaultStateDir(const std::string& fixture_path) {
  return "/tmp/gpulet-sim/" + std::filesystem::path(fixture_path).stem().string();
}

std::string ParsedFixturePath(const std::string& state_dir) {
  return state_dir + "/fixture.json";
}

Status WriteParsedFixture(const Fixture& fixture, const std::string& source_path,
                          const std::string& source_text, const std::string& state_dir) {
  const json doc = {
      {"source", source_path}, {"text", source_text}, {"fixture", FixtureToJson(fixture)}};
  // Written whole then renamed: a library reading it never sees half of it.
  const std::string path = ParsedFixturePath(state_dir);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << doc.dump();
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      return Status(ErrorCode::kInternal, tmp + ": cannot write the parsed fixture");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return Status(ErrorCode::kInternal, path + ": cannot write the parsed fixture");
  }
  return {};
}

std::optional<Fixture> ReadParsedFixture(const std::string& source_path,
                                         const std::string& source_text,
                                         const std::string& state_dir) {
  std::optional<std::string> copy = ReadFixtureText(ParsedFixturePath(state_dir));
  if (!copy) return std::nullopt;
  json doc = json::parse(*copy, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc.contains("source") || !doc["source"].is_string() ||
      doc["source"].get<std::string>() != source_path || !doc.contains("text") ||
      !doc["text"].is_string() || !doc.contains("fixture")) {
    return std::nullopt;
  }
  if (source_text != doc["text"].get_ref<const std::string&>()) return std::nullopt;
  Result<Fixture> fixture = FixtureFromJson(doc["fixture"]);
  if (!fixture.ok()) return std::nullopt;
  return std::move(fixture).value();
}

}  // namespace gpulet::sim
