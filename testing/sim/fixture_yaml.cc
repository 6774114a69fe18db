// The fixture's YAML form (fixture.h): parsed with yaml-cpp. Apart from the rest of the fixture
// code so that the simulated driver library, which reads the parsed form (fixture_json.h), does not
// link yaml-cpp and, through it, the shared C++ runtime.
#include "sim/fixture.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <functional>
#include <optional>
#include <set>
#include <stdexcept>

#include "gpu/nvml_api.h"

namespace gpulet::sim {
namespace {

// Thrown inside the parser only; LoadFixture turns it into a Status.
struct FixtureError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Parser {
 public:
  explicit Parser(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void Fail(const YAML::Node& at, const std::string& field,
                         const std::string& problem) const {
    std::string where = file_;
    if (at.IsDefined() && at.Mark().line >= 0) where += ":" + std::to_string(at.Mark().line + 1);
    throw FixtureError(where + ": " + field + ": " + problem);
  }

  std::string Describe(const YAML::Node& n) const {
    if (n.IsScalar()) return "\"" + n.Scalar() + "\"";
    if (n.IsSequence()) return "a list";
    if (n.IsMap()) return "a mapping";
    return "nothing";
  }

  std::string String(const YAML::Node& n, const std::string& field) const {
    if (!n.IsScalar()) Fail(n, field, "expected a string, got " + Describe(n));
    return n.Scalar();
  }

  uint64_t Uint(const YAML::Node& n, const std::string& field) const {
    if (!n.IsScalar()) Fail(n, field, "expected an integer, got " + Describe(n));
    const std::string& s = n.Scalar();
    uint64_t v = 0;
    int base = 10;
    const char* begin = s.data();
    const char* end = s.data() + s.size();
    if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
      base = 16;
      begin += 2;
    }
    auto [ptr, ec] = std::from_chars(begin, end, v, base);
    if (ec != std::errc() || ptr != end || begin == end) {
      Fail(n, field, "expected an integer, got \"" + s + "\"");
    }
    return v;
  }

  unsigned Uint32(const YAML::Node& n, const std::string& field,
                  uint64_t max = 0xFFFFFFFFULL) const {
    uint64_t v = Uint(n, field);
    if (v > max) Fail(n, field, "must be <= " + std::to_string(max) + ", got " + std::to_string(v));
    return static_cast<unsigned>(v);
  }

  int Int(const YAML::Node& n, const std::string& field) const {
    if (n.IsScalar() && !n.Scalar().empty() && n.Scalar()[0] == '-') {
      if (n.Scalar() == "-1") return -1;
      Fail(n, field, "must be -1 (unknown) or >= 0, got \"" + n.Scalar() + "\"");
    }
    return static_cast<int>(Uint32(n, field, 0x7FFFFFFF));
  }

  bool Bool(const YAML::Node& n, const std::string& field) const {
    if (n.IsScalar()) {
      if (n.Scalar() == "true") return true;
      if (n.Scalar() == "false") return false;
    }
    Fail(n, field, "expected true or false, got " + Describe(n));
  }

  void RequireMap(const YAML::Node& n, const std::string& field) const {
    if (!n.IsMap()) Fail(n, field, "expected a mapping, got " + Describe(n));
  }
  void RequireSeq(const YAML::Node& n, const std::string& field) const {
    if (!n.IsSequence()) Fail(n, field, "expected a list, got " + Describe(n));
  }

  // Calls `fn(key, value)` for each entry of a mapping, rejecting keys not in `allowed`.
  void ForEachKey(const YAML::Node& map, const std::string& field,
                  const std::set<std::string>& allowed,
                  const std::function<void(const std::string&, const YAML::Node&)>& fn) const {
    RequireMap(map, field.empty() ? "(top level)" : field);
    for (auto it = map.begin(); it != map.end(); ++it) {
      const std::string key = it->first.Scalar();
      const std::string path = field.empty() ? key : field + "." + key;
      if (allowed.count(key) == 0) {
        std::string list;
        for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
        Fail(it->first, path, "unknown key (known: " + list + ")");
      }
      fn(key, it->second);
    }
  }

  void ParseBusId(const YAML::Node& n, const std::string& field, GpuSpec& g) const {
    const std::string s = String(n, field);
    unsigned dom = 0, bus = 0, dev = 0, fn = 0;
    char tail = 0;
    bool ok = std::sscanf(s.c_str(), "%x:%x:%x.%x%c", &dom, &bus, &dev, &fn, &tail) == 4;
    size_t colon = s.find(':');
    ok = ok && (colon == 4 || colon == 8) && bus <= 0xFF && dev <= 0x1F && fn <= 7 && dom <= 0xFFFF;
    if (!ok) Fail(n, field, "expected a PCI address like \"0000:18:00.0\", got \"" + s + "\"");
    g.domain = dom;
    g.bus = bus;
    g.device = dev;
    g.function = fn;
  }

  // Applies one per-GPU key (from `defaults` or a `gpus[i]` entry).
  void ApplyGpuKey(GpuSpec& g, const std::string& key, const YAML::Node& v,
                   const std::string& field, const Fixture& f, bool& have_bus) const {
    if (key == "name") {
      g.name = String(v, field);
    } else if (key == "uuid") {
      g.uuid = String(v, field);
      if (g.uuid.rfind("GPU-", 0) != 0) Fail(v, field, "must start with \"GPU-\"");
    } else if (key == "bus_id") {
      ParseBusId(v, field, g);
      have_bus = true;
    } else if (key == "minor") {
      g.minor = Uint32(v, field, 255);
    } else if (key == "memory_mib") {
      g.memory_mib = Uint(v, field);
      if (g.memory_mib == 0) Fail(v, field, "must be > 0");
    } else if (key == "compute_capability") {
      const std::string s = String(v, field);
      int major = 0, minor = 0;
      char tail = 0;
      if (std::sscanf(s.c_str(), "%d.%d%c", &major, &minor, &tail) != 2 || major <= 0 ||
          minor < 0) {
        Fail(v, field, "expected MAJOR.MINOR like \"9.0\", got \"" + s + "\"");
      }
      g.cc_major = major;
      g.cc_minor = minor;
    } else if (key == "architecture") {
      static const std::set<std::string> kArchs = {
          "kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell"};
      g.architecture = String(v, field);
      if (kArchs.count(g.architecture) == 0) {
        Fail(v, field, "unknown architecture \"" + g.architecture + "\"");
      }
    } else if (key == "sm_count") {
      g.sm_count = Uint32(v, field);
    } else if (key == "pci_device_id") {
      g.pci_device_id = Uint32(v, field);
    } else if (key == "pci_subsystem_id") {
      g.pci_subsystem_id = Uint32(v, field);
    } else if (key == "numa") {
      g.numa = Int(v, field);
      if (g.numa >= static_cast<int>(f.numa_cpus.size())) {
        Fail(v, field,
             "NUMA node " + std::to_string(g.numa) + " is not in numa_nodes (" +
                 std::to_string(f.numa_cpus.size()) + " defined)");
      }
    } else if (key == "pcie_switch") {
      g.pcie_switch = Int(v, field);
    } else if (key == "power_limit_w") {
      g.power_limit_w = Uint32(v, field, 10000);
    } else if (key == "idle_power_w") {
      g.idle_power_w = Uint32(v, field, 10000);
    } else if (key == "max_sm_clock_mhz") {
      g.max_sm_clock_mhz = Uint32(v, field, 100000);
    } else if (key == "mem_clock_mhz") {
      g.mem_clock_mhz = Uint32(v, field, 100000);
    } else if (key == "mig_capable") {
      g.mig_capable = Bool(v, field);
    } else if (key == "mig") {
      RequireSeq(v, field);
      g.mig.clear();
      for (size_t i = 0; i < v.size(); ++i) {
        const std::string mf = field + "[" + std::to_string(i) + "]";
        MigDeviceSpec m;
        bool have_profile = false, have_gi = false;
        ForEachKey(v[i], mf, {"profile", "gi", "ci", "placement", "uuid"},
                   [&](const std::string& k, const YAML::Node& mv) {
                     const std::string kf = mf + "." + k;
                     if (k == "profile") {
                       m.profile = String(mv, kf);
                       auto p = f.mig_profiles.find(m.profile);
                       if (p == f.mig_profiles.end()) {
                         std::string known;
                         for (const auto& [name, _] : f.mig_profiles) {
                           known += (known.empty() ? "" : ", ") + name;
                         }
                         Fail(mv, kf,
                              "unknown MIG profile \"" + m.profile +
                                  "\" (mig_profiles: " + (known.empty() ? "none" : known) + ")");
                       }
                       m.facts = p->second;
                       have_profile = true;
                     } else if (k == "gi") {
                       m.gi = Uint32(mv, kf, 14);
                       have_gi = true;
                     } else if (k == "ci") {
                       m.ci = Uint32(mv, kf, 7);
                     } else if (k == "placement") {
                       m.placement = Uint32(mv, kf, 7);
                     } else if (k == "uuid") {
                       m.uuid = String(mv, kf);
                       if (m.uuid.rfind("MIG-", 0) != 0) Fail(mv, kf, "must start with \"MIG-\"");
                     }
                   });
        if (!have_profile) Fail(v[i], mf + ".profile", "required");
        if (!have_gi) Fail(v[i], mf + ".gi", "required");
        g.mig.push_back(m);
      }
    } else if (key == "processes") {
      RequireSeq(v, field);
      g.processes.clear();
      for (size_t i = 0; i < v.size(); ++i) {
        const std::string pf = field + "[" + std::to_string(i) + "]";
        SimProcess p;
        bool have_pid = false;
        ForEachKey(v[i], pf, {"pid", "memory_mib", "sm_util", "mem_util", "gi", "ci"},
                   [&](const std::string& k, const YAML::Node& pv) {
                     const std::string kf = pf + "." + k;
                     if (k == "pid") {
                       p.pid = Uint32(pv, kf);
                       have_pid = p.pid > 0;
                       if (!have_pid) Fail(pv, kf, "must be > 0");
                     } else if (k == "memory_mib") {
                       p.memory_mib = Uint(pv, kf);
                     } else if (k == "sm_util") {
                       p.sm_util = Uint32(pv, kf, 100);
                     } else if (k == "mem_util") {
                       p.mem_util = Uint32(pv, kf, 100);
                     } else if (k == "gi") {
                       p.gi = Uint32(pv, kf, 14);
                     } else if (k == "ci") {
                       p.ci = Uint32(pv, kf, 7);
                     }
                   });
        if (!have_pid) Fail(v[i], pf + ".pid", "required");
        g.processes.push_back(p);
      }
    }
  }

  Fixture Parse(const YAML::Node& root, const std::string& stem) const {
    Fixture f;
    f.path = file_;
    f.name = stem;
    if (!root.IsMap()) Fail(root, "(top level)", "expected a mapping, got " + Describe(root));

    static const std::set<std::string> kGpuKeys = {"name",
                                                   "uuid",
                                                   "bus_id",
                                                   "minor",
                                                   "memory_mib",
                                                   "compute_capability",
                                                   "architecture",
                                                   "sm_count",
                                                   "pci_device_id",
                                                   "pci_subsystem_id",
                                                   "numa",
                                                   "pcie_switch",
                                                   "power_limit_w",
                                                   "idle_power_w",
                                                   "max_sm_clock_mhz",
                                                   "mem_clock_mhz",
                                                   "mig_capable",
                                                   "mig",
                                                   "processes"};

    // Order matters: numa_nodes and mig_profiles before the GPUs that refer to them.
    std::optional<YAML::Node> defaults_n, gpus_n, count_n, nvlink_n;
    bool have_driver = false, have_cuda = false;
    ForEachKey(
        root, "",
        {"name", "driver_version", "cuda_version", "seed", "init_error", "numa_nodes",
         "cpu_topology", "mig_profiles", "defaults", "count", "gpus", "nvlink"},
        [&](const std::string& key, const YAML::Node& v) {
          if (key == "name") {
            f.name = String(v, key);
          } else if (key == "driver_version") {
            f.driver_version = String(v, key);
            have_driver = true;
          } else if (key == "cuda_version") {
            f.cuda_version = static_cast<int>(Uint32(v, key, 999999));
            if (f.cuda_version < 1000) Fail(v, key, "expected e.g. 12040 for CUDA 12.4");
            have_cuda = true;
          } else if (key == "seed") {
            f.seed = Uint(v, key);
          } else if (key == "init_error") {
            auto rc = NvmlReturnFromName(String(v, key));
            if (!rc || *rc == NVML_SUCCESS) {
              Fail(v, key, "unknown NVML error name \"" + v.Scalar() + "\"");
            }
            f.init_error = *rc;
          } else if (key == "cpu_topology") {
            Fixture::CpuTopology t;
            ForEachKey(v, key, {"sockets", "cores_per_socket", "threads_per_core", "numbering"},
                       [&](const std::string& k, const YAML::Node& c) {
                         const std::string tf = key + "." + k;
                         if (k == "numbering") {
                           const std::string n = String(c, tf);
                           if (n != "sequential" && n != "alternating") {
                             Fail(c, tf, "expected sequential or alternating");
                           }
                           t.alternating = n == "alternating";
                         } else {
                           const unsigned u = Uint32(c, tf, 4096);
                           if (u == 0) Fail(c, tf, "must be >= 1");
                           (k == "sockets"            ? t.sockets
                            : k == "cores_per_socket" ? t.cores_per_socket
                                                      : t.threads_per_core) = u;
                         }
                       });
            f.cpu_topology = t;
          } else if (key == "numa_nodes") {
            RequireSeq(v, key);
            for (size_t i = 0; i < v.size(); ++i) {
              const std::string nf = key + "[" + std::to_string(i) + "]";
              std::string cpus;
              ForEachKey(v[i], nf, {"cpus"}, [&](const std::string& k, const YAML::Node& c) {
                cpus = String(c, nf + "." + k);
                for (char ch : cpus) {
                  if (!(std::isdigit(static_cast<unsigned char>(ch)) || ch == '-' || ch == ',')) {
                    Fail(c, nf + "." + k, "expected a CPU list like \"0-55,112-167\"");
                  }
                }
              });
              f.numa_cpus.push_back(cpus);
            }
          } else if (key == "mig_profiles") {
            RequireMap(v, key);
            for (auto it = v.begin(); it != v.end(); ++it) {
              const std::string pname = it->first.Scalar();
              const std::string pf = key + "." + pname;
              MigProfile p;
              bool have[3] = {false, false, false};
              bool have_id = false;
              ForEachKey(it->second, pf,
                         {"slices", "memory_mb", "sms", "id", "placements", "placement_size"},
                         [&](const std::string& k, const YAML::Node& pv) {
                           if (k == "id") {
                             p.id = Uint32(pv, pf + "." + k, NVML_GPU_INSTANCE_PROFILE_COUNT - 1);
                             have_id = true;
                           } else if (k == "placements") {
                             RequireSeq(pv, pf + "." + k);
                             for (size_t j = 0; j < pv.size(); ++j) {
                               p.placements.push_back(
                                   Uint32(pv[j], pf + "." + k + "[" + std::to_string(j) + "]", 7));
                             }
                           } else if (k == "placement_size") {
                             p.placement_size = Uint32(pv, pf + "." + k, 8);
                           } else if (k == "slices") {
                             p.slices = Uint32(pv, pf + "." + k, 7);
                             have[0] = p.slices > 0;
                             if (!have[0]) Fail(pv, pf + "." + k, "must be 1..7");
                           } else if (k == "memory_mb") {
                             p.memory_mb = Uint(pv, pf + "." + k);
                             have[1] = true;
                           } else {
                             p.sms = Uint32(pv, pf + "." + k);
                             have[2] = true;
                           }
                         });
              const char* names[3] = {"slices", "memory_mb", "sms"};
              for (int i = 0; i < 3; ++i) {
                if (!have[i]) Fail(it->second, pf + "." + names[i], "required");
              }
              FillMigProfileDefaults(p, have_id);
              for (unsigned start : p.placements) {
                if (start + p.placement_size > 8) {
                  Fail(it->second, pf + ".placements",
                       "start " + std::to_string(start) + " + size " +
                           std::to_string(p.placement_size) + " exceeds 8 memory slices");
                }
              }
              f.mig_profiles[pname] = p;
            }
          } else if (key == "defaults") {
            defaults_n.emplace(v);
          } else if (key == "count") {
            count_n.emplace(v);
          } else if (key == "gpus") {
            gpus_n.emplace(v);
          } else if (key == "nvlink") {
            nvlink_n.emplace(v);
          }
        });
    if (!have_driver) Fail(root, "driver_version", "required");
    if (!have_cuda) Fail(root, "cuda_version", "required");
    // Absent sections stay undefined (a default-constructed YAML::Node is a defined null).
    const YAML::Node undefined = static_cast<const YAML::Node&>(root)["__gpulet_absent__"];
    const YAML::Node defaults = defaults_n.value_or(undefined);
    const YAML::Node gpus = gpus_n.value_or(undefined);
    const YAML::Node count = count_n.value_or(undefined);
    const YAML::Node nvlink = nvlink_n.value_or(undefined);

    GpuSpec base;
    bool base_bus = false;
    if (defaults.IsDefined()) {
      ForEachKey(defaults, "defaults", kGpuKeys, [&](const std::string& k, const YAML::Node& v) {
        if (k == "bus_id" || k == "uuid" || k == "minor") {
          Fail(v, "defaults." + k, "is per GPU and cannot be a default");
        }
        ApplyGpuKey(base, k, v, "defaults." + k, f, base_bus);
      });
    }

    if (count.IsDefined() && gpus.IsDefined()) {
      Fail(count, "count", "give either count or gpus, not both");
    }
    if (count.IsDefined()) {
      unsigned n = Uint32(count, "count", 256);
      if (n == 0) Fail(count, "count", "must be > 0");
      for (unsigned i = 0; i < n; ++i) {
        GpuSpec g = base;
        g.index = i;
        g.domain = i / 32;
        g.bus = 0x10 + (i % 32) * 4;
        g.minor = i;
        if (!f.numa_cpus.empty()) g.numa = static_cast<int>(i * f.numa_cpus.size() / n);
        g.pcie_switch = static_cast<int>(i / 2);
        Finish(g, f, count, "gpus[" + std::to_string(i) + "]");
        f.gpus.push_back(g);
      }
    } else if (gpus.IsDefined()) {
      RequireSeq(gpus, "gpus");
      for (size_t i = 0; i < gpus.size(); ++i) {
        const std::string gf = "gpus[" + std::to_string(i) + "]";
        GpuSpec g = base;
        g.index = static_cast<unsigned>(i);
        g.minor = g.index;
        bool have_bus = false;
        ForEachKey(gpus[i], gf, kGpuKeys, [&](const std::string& k, const YAML::Node& v) {
          ApplyGpuKey(g, k, v, gf + "." + k, f, have_bus);
        });
        if (!have_bus) Fail(gpus[i], gf + ".bus_id", "required");
        Finish(g, f, gpus[i], gf);
        f.gpus.push_back(g);
      }
    } else {
      Fail(root, "gpus", "required (or count)");
    }

    // Cross-GPU checks: unique bus ids, minors and UUIDs.
    std::map<std::string, size_t> seen_bus, seen_uuid;
    std::map<unsigned, size_t> seen_minor;
    for (size_t i = 0; i < f.gpus.size(); ++i) {
      const auto& g = f.gpus[i];
      const YAML::Node at = gpus.IsDefined() ? gpus[i] : count;
      const std::string gf = "gpus[" + std::to_string(i) + "]";
      if (auto [it, fresh] = seen_bus.emplace(g.NvmlBusId(), i); !fresh) {
        Fail(at, gf + ".bus_id", "duplicates gpus[" + std::to_string(it->second) + "]");
      }
      if (auto [it, fresh] = seen_uuid.emplace(g.uuid, i); !fresh) {
        Fail(at, gf + ".uuid", "duplicates gpus[" + std::to_string(it->second) + "]");
      }
      if (auto [it, fresh] = seen_minor.emplace(g.minor, i); !fresh) {
        Fail(at, gf + ".minor", "duplicates gpus[" + std::to_string(it->second) + "]");
      }
    }

    const size_t n = f.gpus.size();
    f.nvlinks.assign(n, std::vector<unsigned>(n, 0));
    if (nvlink.IsDefined()) {
      ForEachKey(nvlink, "nvlink", {"all_pairs", "pairs", "switch_links"},
                 [&](const std::string& k, const YAML::Node& v) {
                   const std::string kf = "nvlink." + k;
                   if (k == "switch_links") {
                     f.nvswitch_links = Uint32(v, kf, NVML_NVLINK_MAX_LINKS);
                     for (size_t a = 0; a < n; ++a) {
                       for (size_t b = 0; b < n; ++b) {
                         f.nvlinks[a][b] = a == b ? 0 : f.nvswitch_links;
                       }
                     }
                     return;
                   }
                   if (k == "all_pairs") {
                     unsigned links = Uint32(v, kf, 64);
                     for (size_t a = 0; a < n; ++a) {
                       for (size_t b = 0; b < n; ++b) f.nvlinks[a][b] = a == b ? 0 : links;
                     }
                     return;
                   }
                   RequireSeq(v, kf);
                   for (size_t i = 0; i < v.size(); ++i) {
                     const std::string pf = kf + "[" + std::to_string(i) + "]";
                     if (!v[i].IsSequence() || v[i].size() != 3) {
                       Fail(v[i], pf, "expected [gpu, gpu, links], got " + Describe(v[i]));
                     }
                     unsigned a = Uint32(v[i][0], pf, 0xFFFF), b = Uint32(v[i][1], pf, 0xFFFF);
                     unsigned links = Uint32(v[i][2], pf, 64);
                     if (a >= n || b >= n || a == b) {
                       Fail(v[i], pf, "GPU indices must differ and be < " + std::to_string(n));
                     }
                     f.nvlinks[a][b] = f.nvlinks[b][a] = links;
                   }
                 });
    }
    return f;
  }

  // Fills derived values and checks what the merged defaults + GPU entry must have.
  void Finish(GpuSpec& g, const Fixture& f, const YAML::Node& at, const std::string& gf) const {
    if (g.name.empty()) Fail(at, gf + ".name", "required");
    if (g.memory_mib == 0) Fail(at, gf + ".memory_mib", "required");
    if (g.cc_major == 0) Fail(at, gf + ".compute_capability", "required");
    if (g.architecture.empty()) Fail(at, gf + ".architecture", "required");
    if (g.uuid.empty()) g.uuid = DerivedUuid("GPU-", f.name + "/" + std::to_string(g.index));
    if (g.mig_enabled()) {
      if (!g.mig_capable) Fail(at, gf + ".mig", "GPU is not mig_capable");
      unsigned slices = 0;
      std::set<std::pair<unsigned, unsigned>> ids;
      for (size_t i = 0; i < g.mig.size(); ++i) {
        auto& m = g.mig[i];
        if (m.ci == 0) slices += m.facts.slices;  // compute instances share their GI's slices
        if (!ids.emplace(m.gi, m.ci).second) {
          Fail(at, gf + ".mig[" + std::to_string(i) + "]",
               "duplicate gi " + std::to_string(m.gi) + " / ci " + std::to_string(m.ci));
        }
        if (m.uuid.empty()) {
          m.uuid = DerivedMigUuid(g.uuid, m.gi, m.ci);
        }
      }
      if (slices > 7) {
        Fail(at, gf + ".mig", "uses " + std::to_string(slices) + " GPU slices, at most 7 exist");
      }
    }
  }

 private:
  std::string file_;
};

std::string Stem(const std::string& path) {
  size_t slash = path.find_last_of('/');
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  size_t dot = base.find_last_of('.');
  return dot == std::string::npos ? base : base.substr(0, dot);
}

}  // namespace

Result<Fixture> ParseFixture(const std::string& text, const std::string& file) {
  Parser parser(file);
  try {
    YAML::Node root = YAML::Load(text);
    return parser.Parse(root, Stem(file));
  } catch (const FixtureError& e) {
    return Status(ErrorCode::kInvalidInput, e.what());
  } catch (const YAML::Exception& e) {
    return Status(ErrorCode::kInvalidInput,
                  file + ":" + std::to_string(e.mark.line + 1) + ": (syntax): " + e.msg);
  }
}

Result<Fixture> LoadFixture(const std::string& path) {
  std::optional<std::string> text = ReadFixtureText(path);
  if (!text) return Status(ErrorCode::kNotFound, path + ": cannot read fixture");
  return ParseFixture(*text, path);
}

}  // namespace gpulet::sim
