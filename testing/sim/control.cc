#include "sim/control.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "sim/simulation.h"

namespace gpulet::sim {
namespace {

using nlohmann::json;

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

// Closes a file descriptor (and with it any flock) when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

template <typename T>
void PutOptional(json& j, const char* key, const std::optional<T>& v) {
  if (v) j[key] = *v;
}

template <typename T>
void GetOptional(const json& j, const char* key, std::optional<T>& v) {
  if (j.contains(key) && !j.at(key).is_null()) v = j.at(key).get<T>();
}

}  // namespace

void ControlState::Queue(SimEvent event) {
  event.seq = next_seq++;
  events.push_back(event);
  while (events.size() > kMaxEvents) events.pop_front();
}

std::string ControlStateToJson(const ControlState& state, int indent) {
  json j;
  j["next_seq"] = state.next_seq;
  json gpus = json::object();
  for (const auto& [index, o] : state.gpus) {
    json g;
    PutOptional(g, "temperature_c", o.temperature_c);
    PutOptional(g, "gpu_util", o.gpu_util);
    PutOptional(g, "mem_util", o.mem_util);
    PutOptional(g, "power_w", o.power_w);
    PutOptional(g, "memory_used_mib", o.memory_used_mib);
    PutOptional(g, "compute_mode", o.compute_mode);
    g["lost"] = o.lost;
    g["ecc_single_bit"] = o.ecc_single_bit;
    g["ecc_double_bit"] = o.ecc_double_bit;
    gpus[std::to_string(index)] = g;
  }
  j["gpus"] = gpus;
  json events = json::array();
  for (const auto& e : state.events) {
    json ev = {{"seq", e.seq}, {"gpu", e.gpu}, {"type", e.type}, {"data", e.data}};
    if (e.gpu_instance != kNoInstance) ev["gpu_instance"] = e.gpu_instance;
    if (e.compute_instance != kNoInstance) ev["compute_instance"] = e.compute_instance;
    events.push_back(ev);
  }
  j["events"] = events;
  if (!state.mig.empty()) {
    json mig = json::object();
    for (const auto& [index, layout] : state.mig) {
      json instances = json::array();
      for (const auto& i : layout.instances) {
        instances.push_back(
            {{"gi", i.gi}, {"profile", i.profile}, {"placement", i.placement}, {"cis", i.cis}});
      }
      mig[std::to_string(index)] = {{"enabled", layout.enabled}, {"instances", instances}};
    }
    j["mig"] = mig;
  }
  if (state.mig_create_fail_countdown > 0) {
    j["mig_create_fail_countdown"] = state.mig_create_fail_countdown;
  }
  if (!state.processes.empty()) {
    json processes = json::object();
    for (const auto& [index, list] : state.processes) {
      json entries = json::array();
      for (const SimProcess& p : list) {
        entries.push_back({{"pid", p.pid},
                           {"memory_mib", p.memory_mib},
                           {"sm_util", p.sm_util},
                           {"mem_util", p.mem_util},
                           {"gi", p.gi},
                           {"ci", p.ci}});
      }
      processes[std::to_string(index)] = entries;
    }
    j["processes"] = processes;
  }
  return j.dump(indent);
}

Result<ControlState> ControlStateFromJson(const std::string& text, const std::string& source) {
  ControlState s;
  std::string field = "(document)";
  try {
    json j = json::parse(text);
    field = "next_seq";
    s.next_seq = j.at("next_seq").get<uint64_t>();
    field = "gpus";
    for (const auto& [key, g] : j.at("gpus").items()) {
      field = "gpus." + key;
      GpuOverrides o;
      GetOptional(g, "temperature_c", o.temperature_c);
      GetOptional(g, "gpu_util", o.gpu_util);
      GetOptional(g, "mem_util", o.mem_util);
      GetOptional(g, "power_w", o.power_w);
      GetOptional(g, "memory_used_mib", o.memory_used_mib);
      GetOptional(g, "compute_mode", o.compute_mode);
      o.lost = g.value("lost", false);
      o.ecc_single_bit = g.value("ecc_single_bit", uint64_t{0});
      o.ecc_double_bit = g.value("ecc_double_bit", uint64_t{0});
      s.gpus[static_cast<unsigned>(std::stoul(key))] = o;
    }
    field = "events";
    for (const auto& ev : j.at("events")) {
      SimEvent e;
      e.seq = ev.at("seq").get<uint64_t>();
      e.gpu = ev.at("gpu").get<unsigned>();
      e.type = ev.at("type").get<uint64_t>();
      e.data = ev.at("data").get<uint64_t>();
      e.gpu_instance = ev.value("gpu_instance", kNoInstance);
      e.compute_instance = ev.value("compute_instance", kNoInstance);
      s.events.push_back(e);
    }
    if (j.contains("mig")) {
      for (const auto& [key, m] : j.at("mig").items()) {
        field = "mig." + key;
        MigLayoutState layout;
        layout.enabled = m.at("enabled").get<bool>();
        for (const auto& i : m.at("instances")) {
          MigInstanceState inst;
          inst.gi = i.at("gi").get<unsigned>();
          inst.profile = i.at("profile").get<std::string>();
          inst.placement = i.at("placement").get<unsigned>();
          inst.cis = i.at("cis").get<std::vector<unsigned>>();
          layout.instances.push_back(std::move(inst));
        }
        s.mig[static_cast<unsigned>(std::stoul(key))] = std::move(layout);
      }
    }
    field = "mig_create_fail_countdown";
    s.mig_create_fail_countdown = j.value("mig_create_fail_countdown", 0u);
    if (j.contains("processes")) {
      for (const auto& [key, list] : j.at("processes").items()) {
        field = "processes." + key;
        std::vector<SimProcess>& out = s.processes[static_cast<unsigned>(std::stoul(key))];
        for (const auto& p : list) {
          SimProcess sp;
          sp.pid = p.at("pid").get<unsigned>();
          sp.memory_mib = p.value("memory_mib", uint64_t{0});
          sp.sm_util = p.value("sm_util", 0u);
          sp.mem_util = p.value("mem_util", 0u);
          sp.gi = p.value("gi", kNoInstance);
          sp.ci = p.value("ci", kNoInstance);
          out.push_back(sp);
        }
      }
    }
  } catch (const std::exception& e) {
    return Status(ErrorCode::kInvalidInput, source + ": " + field + ": " + e.what());
  }
  return s;
}

ControlFile::ControlFile(std::string state_dir) : dir_(std::move(state_dir)) {}

Result<ControlState> ControlFile::Read() const {
  std::ifstream in(path());
  if (!in) {
    if (errno == ENOENT) return ControlState{};
    return Status(ErrorCode::kInternal, Errno(path()));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ControlStateFromJson(ss.str(), path());
}

Result<ControlState> ControlFile::Update(const std::function<void(ControlState&)>& change) const {
  const std::string lock_path = dir_ + "/control.lock";
  Fd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (lock.get() < 0) return Status(ErrorCode::kInternal, Errno(lock_path));
  while (::flock(lock.get(), LOCK_EX) != 0) {
    if (errno != EINTR) return Status(ErrorCode::kInternal, Errno("flock " + lock_path));
  }
  Result<ControlState> current = Read();
  if (!current.ok()) return current;
  ControlState state = std::move(current).value();
  change(state);

  const std::string tmp = path() + ".tmp." + std::to_string(::getpid());
  const std::string text = ControlStateToJson(state) + "\n";
  {
    Fd out(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (out.get() < 0) return Status(ErrorCode::kInternal, Errno(tmp));
    size_t done = 0;
    while (done < text.size()) {
      ssize_t n = ::write(out.get(), text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Status(ErrorCode::kInternal, Errno("write " + tmp));
      done += static_cast<size_t>(n);
    }
  }
  if (::rename(tmp.c_str(), path().c_str()) != 0) {
    int saved = errno;
    ::unlink(tmp.c_str());
    errno = saved;
    return Status(ErrorCode::kInternal, Errno("rename " + tmp));
  }
  return state;
}

bool ControlFileWatch::Changed() {
  struct stat st {};
  bool exists = ::stat(path_.c_str(), &st) == 0;
  int64_t mtime = exists ? int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec : 0;
  bool changed = first_ || exists != existed_ ||
                 (exists && (st.st_ino != ino_ || mtime != mtime_ns_ || st.st_size != size_));
  first_ = false;
  existed_ = exists;
  ino_ = exists ? st.st_ino : 0;
  mtime_ns_ = mtime;
  size_ = exists ? st.st_size : 0;
  return changed;
}

// Declared in simulation.h; here so that the driver library, which sets overrides (the compute
// mode), does not link the simulation's setup.
Status SetOverrides(const ControlFile& control, unsigned gpu, const GpuOverrides& set) {
  return control.Update([&](ControlState& st) {
    GpuOverrides& o = st.gpus[gpu];
    if (set.temperature_c) o.temperature_c = set.temperature_c;
    if (set.gpu_util) o.gpu_util = set.gpu_util;
    if (set.mem_util) o.mem_util = set.mem_util;
    if (set.power_w) o.power_w = set.power_w;
    if (set.memory_used_mib) o.memory_used_mib = set.memory_used_mib;
    if (set.compute_mode) o.compute_mode = set.compute_mode;
             })
      .status();
}

}  // namespace gpulet::sim
