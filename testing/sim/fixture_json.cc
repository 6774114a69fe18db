#include "sim/fixture_json.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <filesystem>
#include <sstream>

#include "sim/simulation.h"

namespace gpulet::sim {
namespace {

using nlohmann::json;

json ProfileToJson(const MigProfile& p) {
  return {{"slices", p.slices}, {"memory_mb", p.memory_mb}, {"sms", p.sms},
          {"id", p.id},         {"placements", p.placements}, {"placement_size", p.placement_size}};
}

MigProfile ProfileFromJson(const json& j) {
  MigProfile p;
  j.at("slices").get_to(p.slices);
  j.at("memory_mb").get_to(p.memory_mb);
  j.at("sms").get_to(p.sms);
  j.at("id").get_to(p.id);
  j.at("placements").get_to(p.placements);
  j.at("placement_size").get_to(p.placement_size);
  return p;
}

json GpuToJson(const GpuSpec& g) {
  json mig = json::array();
  for (const MigDeviceSpec& m : g.mig) {
    mig.push_back({{"profile", m.profile},
                   {"gi", m.gi},
                   {"ci", m.ci},
                   {"placement", m.placement},
                   {"uuid", m.uuid},
                   {"facts", ProfileToJson(m.facts)}});
  }
  json processes = json::array();
  for (const SimProcess& p : g.processes) {
    processes.push_back({{"pid", p.pid},
                         {"memory_mib", p.memory_mib},
                         {"sm_util", p.sm_util},
                         {"mem_util", p.mem_util},
                         {"gi", p.gi},
                         {"ci", p.ci}});
  }
  return {{"index", g.index},
          {"name", g.name},
          {"uuid", g.uuid},
          {"domain", g.domain},
          {"bus", g.bus},
          {"device", g.device},
          {"function", g.function},
          {"minor", g.minor},
          {"memory_mib", g.memory_mib},
          {"cc_major", g.cc_major},
          {"cc_minor", g.cc_minor},
          {"architecture", g.architecture},
          {"sm_count", g.sm_count},
          {"pci_device_id", g.pci_device_id},
          {"pci_subsystem_id", g.pci_subsystem_id},
          {"numa", g.numa},
          {"pcie_switch", g.pcie_switch},
          {"power_limit_w", g.power_limit_w},
          {"idle_power_w", g.idle_power_w},
          {"max_sm_clock_mhz", g.max_sm_clock_mhz},
          {"mem_clock_mhz", g.mem_clock_mhz},
          {"mig_capable", g.mig_capable},
          {"mig", std::move(mig)},
          {"mig_mode", g.mig_mode},
          {"processes", std::move(processes)}};
}

GpuSpec GpuFromJson(const json& j) {
  GpuSpec g;
  j.at("index").get_to(g.index);
  j.at("name").get_to(g.name);
  j.at("uuid").get_to(g.uuid);
  j.at("domain").get_to(g.domain);
  j.at("bus").get_to(g.bus);
  j.at("device").get_to(g.device);
  j.at("function").get_to(g.function);
  j.at("minor").get_to(g.minor);
  j.at("memory_mib").get_to(g.memory_mib);
  j.at("cc_major").get_to(g.cc_major);
  j.at("cc_minor").get_to(g.cc_minor);
  j.at("architecture").get_to(g.architecture);
  j.at("sm_count").get_to(g.sm_count);
  j.at("pci_device_id").get_to(g.pci_device_id);
  j.at("pci_subsystem_id").get_to(g.pci_subsystem_id);
  j.at("numa").get_to(g.numa);
  j.at("pcie_switch").get_to(g.pcie_switch);
  j.at("power_limit_w").get_to(g.power_limit_w);
  j.at("idle_power_w").get_to(g.idle_power_w);
  j.at("max_sm_clock_mhz").get_to(g.max_sm_clock_mhz);
  j.at("mem_clock_mhz").get_to(g.mem_clock_mhz);
  j.at("mig_capable").get_to(g.mig_capable);
  for (const json& m : j.at("mig")) {
    MigDeviceSpec d;
    m.at("profile").get_to(d.profile);
    m.at("gi").get_to(d.gi);
    m.at("ci").get_to(d.ci);
    m.at("placement").get_to(d.placement);
    m.at("uuid").get_to(d.uuid);
    d.facts = ProfileFromJson(m.at("facts"));
    g.mig.push_back(std::move(d));
  }
  j.at("mig_mode").get_to(g.mig_mode);
  for (const json& p : j.at("processes")) {
    SimProcess s;
    p.at("pid").get_to(s.pid);
    p.at("memory_mib").get_to(s.memory_mib);
    p.at("sm_util").get_to(s.sm_util);
    p.at("mem_util").get_to(s.mem_util);
    p.at("gi").get_to(s.gi);
    p.at("ci").get_to(s.ci);
    g.processes.push_back(s);
  }
  return g;
}

}  // namespace

json FixtureToJson(const Fixture& f) {
  json profiles = json::object();
  for (const auto& [name, p] : f.mig_profiles) profiles[name] = ProfileToJson(p);
  json gpus = json::array();
  for (const GpuSpec& g : f.gpus) gpus.push_back(GpuToJson(g));
  json out = {{"path", f.path},
              {"name", f.name},
              {"driver_version", f.driver_version},
              {"cuda_version", f.cuda_version},
              {"seed", f.seed},
              {"init_error", f.init_error ? json(*f.init_error) : json(nullptr)},
              {"numa_cpus", f.numa_cpus},
              {"cpu_topology", nullptr},
              {"mig_profiles", std::move(profiles)},
              {"gpus", std::move(gpus)},
              {"nvlinks", f.nvlinks},
              {"nvswitch_links", f.nvswitch_links}};
  if (f.cpu_topology) {
    out["cpu_topology"] = {{"sockets", f.cpu_topology->sockets},
                           {"cores_per_socket", f.cpu_topology->cores_per_socket},
                           {"threads_per_core", f.cpu_topology->threads_per_core},
                           {"alternating", f.cpu_topology->alternating}};
  }
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
      Fixture::CpuTopology topology;
      t.at("sockets").get_to(topology.sockets);
      t.at("cores_per_socket").get_to(topology.cores_per_socket);
      t.at("threads_per_core").get_to(topology.threads_per_core);
      t.at("alternating").get_to(topology.alternating);
      f.cpu_topology = topology;
    }
    for (const auto& [name, p] : j.at("mig_profiles").items()) {
      f.mig_profiles[name] = ProfileFromJson(p);
    }
    for (const json& g : j.at("gpus")) f.gpus.push_back(GpuFromJson(g));
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

std::optional<std::string> ReadFixtureText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return ss.str();
}

std::optional<Fixture> ReadParsedFixture(const std::string& source_path,
                                         const std::string& state_dir) {
  std::optional<std::string> copy = ReadFixtureText(ParsedFixturePath(state_dir));
  if (!copy) return std::nullopt;
  json doc = json::parse(*copy, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc.contains("source") || !doc["source"].is_string() ||
      doc["source"].get<std::string>() != source_path || !doc.contains("text") ||
      !doc["text"].is_string() || !doc.contains("fixture")) {
    return std::nullopt;
  }
  std::optional<std::string> text = ReadFixtureText(source_path);
  if (!text || *text != doc["text"].get_ref<const std::string&>()) return std::nullopt;
  Result<Fixture> fixture = FixtureFromJson(doc["fixture"]);
  if (!fixture.ok()) return std::nullopt;
  return std::move(fixture).value();
}

}  // namespace gpulet::sim
