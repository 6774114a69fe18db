#include "slurm/gres.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "slurm/id_list.h"

namespace gpulet::slurm {
namespace {

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool IEquals(const std::string& a, const std::string& b) { return Lower(a) == Lower(b); }

// Lower-case; every run of characters outside [a-z0-9] (and '.' when keep_dot) becomes one '_';
// no leading or trailing '_'.
std::string Sanitize(const std::string& s, bool keep_dot) {
  std::string out;
  bool pending = false;
  for (char raw : Lower(s)) {
    bool ok = std::isalnum(static_cast<unsigned char>(raw)) || (keep_dot && raw == '.');
    if (!ok) {
      pending = true;
      continue;
    }
    if (pending && !out.empty()) out += '_';
    pending = false;
    out += raw;
  }
  return out;
}

// "h100", "a100", "l40s", "a10g", "gh200", "l4", "t4", "a6000": 1-3 letters, 1-4 digits, up to
// two letters.
bool IsModelToken(const std::string& t) {
  size_t i = 0;
  while (i < t.size() && std::isalpha(static_cast<unsigned char>(t[i]))) ++i;
  if (i == 0 || i > 3) return false;
  size_t d = i;
  while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) ++i;
  if (i == d || i - d > 4) return false;
  size_t s = i;
  while (i < t.size() && std::isalpha(static_cast<unsigned char>(t[i]))) ++i;
  return i == t.size() && i - s <= 2;
}

bool IsValidTypeName(const std::string& t) {
  if (t.empty() || t.size() > 64) return false;
  return std::all_of(t.begin(), t.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '_' || c == '.' || c == '-';
  });
}

std::string JoinPath(const std::string& root, const std::string& path) {
  std::string r = root;
  while (!r.empty() && r.back() == '/') r.pop_back();
  return r + path;
}

std::string JoinInts(const std::vector<int>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out;
}

std::string RecordLine(const std::string& node, const GresRecord& r) {
  std::string line = "NodeName=" + node + " Name=" + r.name;
  if (!r.type.empty()) line += " Type=" + r.type;
  if (r.count) line += " Count=" + std::to_string(*r.count);
  std::string files;
  for (size_t i = 0; i < r.files.size(); ++i) files += (i ? "," : "") + r.files[i];
  line += (r.multiple_files ? " MultipleFiles=" : " File=") + files;
  if (r.cores && !r.cores->empty()) line += " Cores=" + *r.cores;
  if (r.links) line += " Links=" + JoinInts(*r.links);
  return line;
}

}  // namespace

std::string GresRecord::describe() const {
  std::string d = "Name=" + name;
  if (!type.empty()) d += " Type=" + type;
  std::string f;
  for (size_t i = 0; i < files.size(); ++i) f += (i ? "," : "") + files[i];
  d += (multiple_files ? " MultipleFiles=" : " File=") + f;
  return d;
}

std::string GpuTypeFromName(const std::string& product_name) {
  std::string lower = Lower(product_name);
  std::vector<std::string> tokens;
  std::string cur;
  for (char c : lower) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      cur += c;
    } else if (!cur.empty()) {
      tokens.push_back(cur);
      cur.clear();
    }
  }
  if (!cur.empty()) tokens.push_back(cur);
  for (const std::string& t : tokens) {
    if (t == "nvidia" || t == "tesla") continue;
    if (IsModelToken(t)) return t;
  }
  std::string s = Sanitize(product_name, false);
  for (const std::string vendor : {"nvidia", "tesla"}) {
    if (s == vendor) s.clear();
    if (s.rfind(vendor + "_", 0) == 0) s = s.substr(vendor.size() + 1);
  }
  return s.empty() ? "gpu" : s;
}

bool IsValidNodeName(const std::string& name) {
  if (name.empty() || name.size() > 253) return false;
  std::stringstream in(name);
  std::string label;
  size_t labels = 0;
  while (std::getline(in, label, '.')) {
    ++labels;
    if (label.empty() || label.size() > 63) return false;
    if (label.front() == '-' || label.back() == '-') return false;
    for (unsigned char c : label) {
      if (!std::isalnum(c) && c != '-') return false;
    }
  }
  return labels > 0 && name.back() != '.';
}

Result<std::map<unsigned, unsigned>> ReadCoreIndex(const std::string& sysfs_root) {
  const std::string base = sysfs_root + "/devices/system/cpu/";
  auto first_line = [](const std::string& path) -> std::optional<std::string> {
    std::ifstream in(path);
    std::string line;
    if (!in || !std::getline(in, line)) return std::nullopt;
    return line;
  };
  std::optional<std::string> online = first_line(base + "online");
  if (!online) return Status(ErrorCode::kNotFound, base + "online: cannot read");
  auto cpus = ParseIdList(*online);
  if (!cpus) return Status(ErrorCode::kInvalidInput, base + "online: not a CPU list");
  // (package, core id) → the core's CPUs.
  std::map<std::pair<long, long>, std::vector<unsigned>> cores;
  for (unsigned cpu : *cpus) {
    const std::string topo = base + "cpu" + std::to_string(cpu) + "/topology/";
    std::optional<std::string> package = first_line(topo + "physical_package_id");
    std::optional<std::string> core = first_line(topo + "core_id");
    if (!package || !core) return Status(ErrorCode::kNotFound, topo + ": cannot read");
    try {
      cores[{std::stol(*package), std::stol(*core)}].push_back(cpu);
    } catch (const std::exception&) {
      return Status(ErrorCode::kInvalidInput, topo + ": not a number");
    }
  }
  // hwloc's order: by package, then by the core's first CPU.
  std::vector<std::tuple<long, unsigned, const std::vector<unsigned>*>> order;
  for (const auto& [key, list] : cores) {
    order.emplace_back(key.first, *std::min_element(list.begin(), list.end()), &list);
  }
  std::sort(order.begin(), order.end());
  std::map<unsigned, unsigned> index;
  for (size_t i = 0; i < order.size(); ++i) {
    for (unsigned cpu : *std::get<2>(order[i])) index[cpu] = static_cast<unsigned>(i);
  }
  return index;
}

Result<NodeGres> PlanNodeGres(const gpu::Inventory& inv, const GresOptions& opt) {
  if (!IsValidNodeName(opt.node_name)) {
    return Status(ErrorCode::kUsage,
                  "node name \"" + opt.node_name +
                      "\": not a valid Slurm hostname (letters, digits, '-' and '.', labels of "
                      "at most 63 characters, no leading or trailing '-')");
  }
  if (!opt.type_override.empty() && !IsValidTypeName(opt.type_override)) {
    return Status(ErrorCode::kUsage, "type override \"" + opt.type_override +
                                         "\": use letters, digits, '_', '.' and '-' only");
  }
  if (opt.threads_per_core == 0) {
    return Status(ErrorCode::kUsage, "threads per core must be at least 1");
  }
  NodeGres out;
  bool any_mig = std::any_of(inv.gpus.begin(), inv.gpus.end(),
                             [](const gpu::Gpu& g) { return g.mig_enabled; });
  bool any_nvlink = false;
  for (size_t i = 0; i < inv.links.size(); ++i) {
    for (size_t j = 0; j < inv.links[i].size(); ++j) {
      if (i != j && inv.links[i][j].nvlinks > 0) any_nvlink = true;
    }
  }
  bool emit_links = any_nvlink && !any_mig;
  if (any_nvlink && any_mig) {
    out.warnings.push_back(
        "Links= omitted: MIG devices have no NVLink peers of their own, so Slurm's device "
        "order and the NVLink matrix do not line up");
  }
  unsigned ncores = opt.cpus / opt.threads_per_core;
  std::vector<GresRecord> whole, shares;
  size_t mig_gpus = 0;
  for (const gpu::Gpu& g : inv.gpus) {
    std::string what = "GPU " + std::to_string(g.index) + " (" + g.pci_bus_id + ")";
    std::string type = opt.type_override.empty() ? GpuTypeFromName(g.name) : opt.type_override;
    std::string dev = JoinPath(opt.dev_root, g.device_path());
    std::optional<std::string> cores;
    if (!g.cpu_affinity.empty()) {
      auto cpus = ParseIdList(g.cpu_affinity);
      if (!cpus) {
        return Status(ErrorCode::kInvalidInput,
                      what + ": cpu affinity \"" + g.cpu_affinity + "\" is not a CPU list");
      }
      std::set<unsigned> core_ids;
      for (unsigned c : *cpus) {
        if (!opt.core_index.empty()) {
          if (auto it = opt.core_index.find(c); it != opt.core_index.end()) {
            core_ids.insert(it->second);
          }
        } else {
          core_ids.insert(opt.threads_per_core > 1 && ncores > 0 ? c % ncores : c);
        }
      }
      cores = FormatIdList(core_ids);
    }
    if (g.mig_enabled) {
      ++mig_gpus;
      for (const gpu::MigDevice& m : g.mig_devices) {
        if (m.gi_cap_path.empty() || m.ci_cap_path.empty()) {
          return Status(ErrorCode::kInvalidInput,
                        what + " MIG device " + std::to_string(m.mig_index) + " (" + m.uuid +
                            "): no nvidia-caps device paths (is /proc/driver/nvidia-caps/"
                            "mig-minors readable?)");
        }
        GresRecord r;
        r.name = "gpu";
        r.type = type + "_" + Sanitize(m.profile, true);
        r.files = {dev, JoinPath(opt.dev_root, m.gi_cap_path),
                   JoinPath(opt.dev_root, m.ci_cap_path)};
        r.multiple_files = true;
        r.cores = cores;
        out.records.push_back(std::move(r));
      }
      continue;
    }
    GresRecord r;
    r.name = "gpu";
    r.type = type;
    r.files = {dev};
    r.cores = cores;
    if (emit_links) {
      std::vector<int> links;
      for (const gpu::Gpu& peer : inv.gpus) {
        if (peer.index == g.index) {
          links.push_back(-1);
        } else if (g.index < inv.links.size() && peer.index < inv.links[g.index].size()) {
          links.push_back(static_cast<int>(inv.links[g.index][peer.index].nvlinks));
        } else {
          links.push_back(0);
        }
      }
      r.links = std::move(links);
    }
    out.records.push_back(std::move(r));
    if (opt.shards > 0) {
      GresRecord s;
      s.name = "shard";
      s.count = opt.shards;
      s.files = {dev};
      shares.push_back(std::move(s));
    }
    if (opt.mps) {
      GresRecord s;
      s.name = "mps";
      s.count = 100;
      s.files = {dev};
      shares.push_back(std::move(s));
    }
  }
  for (GresRecord& s : shares) out.records.push_back(std::move(s));
  if (mig_gpus > 0 && (opt.shards > 0 || opt.mps)) {
    out.warnings.push_back("shard/mps lines cover whole GPUs only; " + std::to_string(mig_gpus) +
                           " GPU(s) in MIG mode get none");
  }
  if (opt.shards > 0 && opt.mps) {
    out.warnings.push_back(
        "shard and mps on one node: Slurm 22.05 then computes CUDA_MPS_ACTIVE_THREAD_PERCENTAGE "
        "from the shard counts; give each node only one of them");
  }
  if (inv.gpus.empty()) out.warnings.push_back("no GPUs found: the node offers no GRES");
  return out;
}

std::string RenderGresConf(const gpu::Inventory& inv, const NodeGres& gres,
                           const GresOptions& opt) {
  std::ostringstream o;
  o << "# gres.conf for node " << opt.node_name << ", generated by "
    << (opt.generator.empty() ? "gpulet" : opt.generator) << " from "
    << (opt.source.empty() ? "driver " + inv.driver_version : opt.source) << ".\n";
  std::map<std::string, unsigned> names;
  for (const gpu::Gpu& g : inv.gpus) ++names[g.name];
  o << "# " << inv.gpus.size() << " GPU(s)";
  const char* sep = ": ";
  for (const auto& [name, n] : names) {
    o << sep << n << " x " << name;
    sep = ", ";
  }
  o << "; " << inv.MigDeviceCount() << " MIG device(s).\n";
  o << "# Do not edit: regenerate with `gpulet slurm gres`, verify with `gpulet slurm gres "
       "--check FILE`.\n";
  for (const std::string& w : gres.warnings) o << "# warning: " << w << "\n";
  o << "AutoDetect=off\n";
  for (const GresRecord& r : gres.records) o << RecordLine(opt.node_name, r) << "\n";
  return o.str();
}

std::string NodeGresValue(const NodeGres& gres) {
  std::vector<std::pair<std::string, uint64_t>> gpu_types;
  uint64_t shards = 0, mps = 0;
  for (const GresRecord& r : gres.records) {
    if (r.name == "gpu") {
      auto it = std::find_if(gpu_types.begin(), gpu_types.end(),
                             [&](const auto& p) { return p.first == r.type; });
      if (it == gpu_types.end()) {
        gpu_types.emplace_back(r.type, 1);
      } else {
        ++it->second;
      }
    } else if (r.name == "shard") {
      shards += r.count.value_or(0);
    } else if (r.name == "mps") {
      mps += r.count.value_or(0);
    }
  }
  std::string v;
  for (const auto& [type, n] : gpu_types) {
    v += (v.empty() ? "" : ",") + std::string("gpu:") + type + ":" + std::to_string(n);
  }
  if (shards) v += (v.empty() ? "" : ",") + std::string("shard:") + std::to_string(shards);
  if (mps) v += (v.empty() ? "" : ",") + std::string("mps:") + std::to_string(mps);
  return v;
}

std::string RenderSlurmConf(const NodeGres& gres, const GresOptions& opt) {
  bool has_shard = false, has_mps = false;
  for (const GresRecord& r : gres.records) {
    has_shard = has_shard || r.name == "shard";
    has_mps = has_mps || r.name == "mps";
  }
  // mps before shard: with GresTypes=gpu,shard,mps Slurm 22.05 reports a wrong
  // CUDA_MPS_ACTIVE_THREAD_PERCENTAGE on nodes that have mps but no shard lines.
  std::string out = "GresTypes=gpu";
  if (has_mps) out += ",mps";
  if (has_shard) out += ",shard";
  out += "\nNodeName=" + opt.node_name;
  if (opt.cpus) out += " CPUs=" + std::to_string(opt.cpus);
  if (opt.cpus && opt.threads_per_core > 1) {
    out += " ThreadsPerCore=" + std::to_string(opt.threads_per_core);
  }
  if (opt.real_memory_mib) out += " RealMemory=" + std::to_string(opt.real_memory_mib);
  std::string value = NodeGresValue(gres);
  if (!value.empty()) out += " Gres=" + value;
  return out + "\n";
}

// ---- parsing an existing gres.conf ----

namespace {

// Splits "a,b[1-2],c" at commas outside brackets.
std::vector<std::string> SplitTopLevel(const std::string& s) {
  std::vector<std::string> parts;
  std::string cur;
  int depth = 0;
  for (char c : s) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  return parts;
}

// Expands one host-list-style item: "nvidia[0-3]" → nvidia0..nvidia3, "n[01-02]" keeps padding.
std::optional<std::vector<std::string>> ExpandItem(const std::string& item) {
  size_t open = item.find('[');
  if (open == std::string::npos) {
    if (item.find(']') != std::string::npos) return std::nullopt;
    return std::vector<std::string>{item};
  }
  size_t close = item.find(']', open);
  if (close == std::string::npos) return std::nullopt;
  std::string prefix = item.substr(0, open), suffix = item.substr(close + 1);
  auto rest = ExpandItem(suffix);
  if (!rest) return std::nullopt;
  std::vector<std::string> out;
  std::stringstream in(item.substr(open + 1, close - open - 1));
  std::string range;
  while (std::getline(in, range, ',')) {
    size_t dash = range.find('-');
    std::string lo_s = range.substr(0, dash);
    std::string hi_s = dash == std::string::npos ? lo_s : range.substr(dash + 1);
    auto lo = ParseIdList(lo_s), hi = ParseIdList(hi_s);
    if (!lo || !hi || lo->size() != 1 || hi->size() != 1 || *lo->begin() > *hi->begin()) {
      return std::nullopt;
    }
    size_t width = lo_s.size();
    for (unsigned v = *lo->begin(); v <= *hi->begin(); ++v) {
      std::string num = std::to_string(v);
      if (num.size() < width) num = std::string(width - num.size(), '0') + num;
      for (const std::string& r : *rest) out.push_back(prefix + num + r);
    }
  }
  return out;
}

std::optional<std::vector<std::string>> ExpandList(const std::string& s) {
  std::vector<std::string> out;
  for (const std::string& item : SplitTopLevel(s)) {
    if (item.empty()) return std::nullopt;
    auto e = ExpandItem(item);
    if (!e) return std::nullopt;
    out.insert(out.end(), e->begin(), e->end());
  }
  return out;
}

std::optional<uint64_t> ParseCount(const std::string& s) {
  if (s.empty()) return std::nullopt;
  uint64_t mult = 1;
  std::string digits = s;
  char last = static_cast<char>(std::toupper(static_cast<unsigned char>(s.back())));
  if (last == 'K' || last == 'M' || last == 'G') {
    mult = last == 'K' ? 1024 : last == 'M' ? 1024 * 1024 : 1024ull * 1024 * 1024;
    digits.pop_back();
  }
  if (digits.empty() || digits.size() > 12) return std::nullopt;
  uint64_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v * mult;
}

}  // namespace

Result<ParsedGresConf> ParseGresConf(const std::string& text, const std::string& file,
                                     const std::string& node_name) {
  ParsedGresConf out;
  std::stringstream in(text);
  std::string raw;
  int lineno = 0;
  while (std::getline(in, raw)) {
    ++lineno;
    int first_line = lineno;
    // A trailing backslash continues the line.
    while (!raw.empty() && raw.back() == '\\') {
      raw.pop_back();
      std::string next;
      if (!std::getline(in, next)) break;
      ++lineno;
      raw += " " + next;
    }
    if (size_t hash = raw.find('#'); hash != std::string::npos) raw.resize(hash);
    std::stringstream tokens(raw);
    std::string tok;
    std::map<std::string, std::string> kv;  // lower-case key → value
    auto where = [&](const std::string& field) {
      return file + ":" + std::to_string(first_line) + ": " + field + ": ";
    };
    while (tokens >> tok) {
      size_t eq = tok.find('=');
      if (eq == std::string::npos || eq == 0) {
        return Status(ErrorCode::kInvalidInput, where(tok) + "expected Key=Value");
      }
      std::string key = Lower(tok.substr(0, eq));
      if (kv.count(key)) {
        return Status(ErrorCode::kInvalidInput, where(tok.substr(0, eq)) + "given twice");
      }
      kv[key] = tok.substr(eq + 1);
    }
    if (kv.empty()) continue;
    if (auto it = kv.find("nodename"); it != kv.end()) {
      auto nodes = ExpandList(it->second);
      if (!nodes) {
        return Status(ErrorCode::kInvalidInput,
                      where("NodeName") + "bad host list \"" + it->second + "\"");
      }
      if (std::find(nodes->begin(), nodes->end(), node_name) == nodes->end()) continue;
    }
    if (auto it = kv.find("autodetect"); it != kv.end()) {
      out.autodetect = it->second;
      out.autodetect_line = first_line;
      if (!kv.count("name")) continue;
    }
    auto name = kv.find("name");
    if (name == kv.end()) {
      return Status(ErrorCode::kInvalidInput, where("Name") + "missing");
    }
    GresRecord base;
    base.name = Lower(name->second);
    base.line = first_line;
    if (auto it = kv.find("type"); it != kv.end()) base.type = it->second;
    if (auto it = kv.find("cores"); it != kv.end()) {
      auto ids = ParseIdList(it->second);
      if (!ids) {
        return Status(ErrorCode::kInvalidInput,
                      where("Cores") + "\"" + it->second + "\" is not a core id list");
      }
      base.cores = FormatIdList(*ids);
    }
    if (auto it = kv.find("links"); it != kv.end()) {
      std::vector<int> links;
      std::stringstream ls(it->second);
      std::string item;
      while (std::getline(ls, item, ',')) {
        try {
          size_t used = 0;
          int v = std::stoi(item, &used);
          if (used != item.size() || v < -1) throw std::invalid_argument(item);
          links.push_back(v);
        } catch (const std::exception&) {
          return Status(ErrorCode::kInvalidInput,
                        where("Links") + "\"" + it->second + "\" is not a list of integers >= -1");
        }
      }
      base.links = std::move(links);
    }
    std::optional<uint64_t> count;
    if (auto it = kv.find("count"); it != kv.end()) {
      count = ParseCount(it->second);
      if (!count) {
        return Status(ErrorCode::kInvalidInput,
                      where("Count") + "\"" + it->second + "\" is not a count");
      }
    }
    auto file_it = kv.find("file");
    auto multi_it = kv.find("multiplefiles");
    if (file_it != kv.end() && multi_it != kv.end()) {
      return Status(ErrorCode::kInvalidInput, where("MultipleFiles") + "File given as well");
    }
    if (multi_it != kv.end()) {
      auto files = ExpandList(multi_it->second);
      if (!files) {
        return Status(ErrorCode::kInvalidInput,
                      where("MultipleFiles") + "bad file list \"" + multi_it->second + "\"");
      }
      GresRecord r = base;
      r.files = *files;
      r.multiple_files = true;
      r.count = count;
      out.records.push_back(std::move(r));
      continue;
    }
    if (file_it == kv.end()) {
      GresRecord r = base;
      r.count = count;
      out.records.push_back(std::move(r));
      continue;
    }
    auto files = ExpandList(file_it->second);
    if (!files) {
      return Status(ErrorCode::kInvalidInput,
                    where("File") + "bad file list \"" + file_it->second + "\"");
    }
    for (const std::string& f : *files) {
      GresRecord r = base;
      r.files = {f};
      // Slurm spreads a Count over the files of one line.
      if (count) r.count = *count / files->size();
      out.records.push_back(std::move(r));
    }
  }
  return out;
}

std::vector<std::string> CompareGres(const NodeGres& expected, const ParsedGresConf& actual,
                                     const std::string& file) {
  std::vector<std::string> problems;
  auto key = [](const GresRecord& r) {
    std::string k = r.name + "|" + (r.multiple_files ? "M" : "F");
    for (const std::string& f : r.files) k += "|" + f;
    return k;
  };
  auto at = [&](const GresRecord& r) {
    return file + ":" + std::to_string(r.line) + ": " + r.describe() + ": ";
  };
  if (actual.autodetect && !IEquals(*actual.autodetect, "off")) {
    problems.push_back(file + ":" + std::to_string(actual.autodetect_line) +
                       ": AutoDetect=" + *actual.autodetect +
                       ": must be off (Debian's Slurm 22.05 has no NVML plugin; the lines "
                       "below describe the devices)");
  }
  std::map<std::string, const GresRecord*> want;
  std::set<std::string> names_wanted;
  for (const GresRecord& r : expected.records) {
    want[key(r)] = &r;
    names_wanted.insert(r.name);
  }
  std::map<std::string, int> seen;  // key → line
  for (const GresRecord& r : actual.records) {
    if (r.files.empty()) {
      problems.push_back(at(r) + "no File: Slurm 22.05 drops a gpu line without File");
      continue;
    }
    std::string k = key(r);
    if (auto dup = seen.find(k); dup != seen.end()) {
      problems.push_back(at(r) + "listed twice (first at line " + std::to_string(dup->second) +
                         ")");
      continue;
    }
    seen[k] = r.line;
    auto it = want.find(k);
    if (it == want.end()) {
      if ((r.name == "shard" || r.name == "mps") && !names_wanted.count(r.name)) {
        problems.push_back(at(r) + "not expected (pass --" +
                           (r.name == "shard" ? std::string("shards N") : std::string("mps")) +
                           " to check " + r.name + " lines)");
      } else {
        problems.push_back(at(r) + "no such device on this node");
      }
      continue;
    }
    const GresRecord& w = *it->second;
    if (!IEquals(r.type, w.type)) {
      problems.push_back(at(r) + (r.type.empty() ? "Type missing" : "Type is " + r.type) +
                         ", hardware has " + (w.type.empty() ? "none" : w.type));
    }
    if (w.count && r.count != w.count) {
      problems.push_back(at(r) +
                         (r.count ? "Count is " + std::to_string(*r.count) : "Count missing") +
                         ", expected " + std::to_string(*w.count));
    }
    if (w.cores && r.cores != w.cores) {
      problems.push_back(at(r) + (r.cores ? "Cores is " + *r.cores : "Cores missing") +
                         ", hardware has " + *w.cores);
    }
    if (w.links && r.links != w.links) {
      problems.push_back(at(r) + (r.links ? "Links is " + JoinInts(*r.links) : "Links missing") +
                         ", hardware has " + JoinInts(*w.links));
    }
  }
  for (const GresRecord& w : expected.records) {
    if (!seen.count(key(w))) problems.push_back("missing: " + w.describe());
  }
  return problems;
}

}  // namespace gpulet::slurm
