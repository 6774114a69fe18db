#include "broker/slurm_side.h"

#include <algorithm>
#include <cctype>
#include <ctime>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>

namespace gpulet::broker {
namespace {

using nlohmann::json;

std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The "errors" array of Slurm's JSON: non-empty means the answer is not to be trusted.
Status CheckErrors(const json& j, const std::string& what) {
  if (!j.is_object()) return {ErrorCode::kUnavailable, what + ": not a JSON object"};
  if (j.contains("errors") && j["errors"].is_array() && !j["errors"].empty()) {
    return {ErrorCode::kUnavailable, what + ": slurm reported errors: " + j["errors"].dump()};
  }
  return {};
}

int IntOr(const json& v, int fallback) {
  if (v.is_number_integer()) return v.get<int>();
  // Newer Slurm wraps numbers as {"set":true,"number":N}.
  if (v.is_object() && v.value("set", false) && v.contains("number") &&
      v["number"].is_number_integer()) {
    return v["number"].get<int>();
  }
  return fallback;
}

std::string StringOr(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

std::map<std::string, int> GpusByType(const std::string& text) {
  std::map<std::string, int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.rfind("gres:", 0) == 0) item = item.substr(5);
    if (item.rfind("gres/", 0) == 0) item = item.substr(5);
    if (item.rfind("gpu", 0) != 0) continue;
    if (item.size() > 3 && item[3] != ':' && item[3] != '=') continue;  // "gpuX": another gres
    item = item.substr(0, item.find('('));
    // gpu[:type][:N] or gpu[:type]=N
    std::string type, count;
    const size_t eq = item.find('=');
    if (eq != std::string::npos) {
      count = item.substr(eq + 1);
      item = item.substr(0, eq);
    }
    std::vector<std::string> parts;
    std::stringstream fields(item);
    for (std::string f; std::getline(fields, f, ':');) parts.push_back(f);
    auto digits = [](const std::string& v) {
      return !v.empty() && v.size() < 10 &&
             std::all_of(v.begin(), v.end(), [](char c) { return std::isdigit(c); });
    };
    if (count.empty() && parts.size() >= 2 && digits(parts.back())) {
      count = parts.back();
      parts.pop_back();
    }
    if (parts.size() >= 2) type = Lower(parts[1]);
    out[type] += digits(count) ? std::stoi(count) : 1;  // "gpu:h100" alone means one
  }
  for (auto it = out.begin(); it != out.end();) it = it->second == 0 ? out.erase(it) : ++it;
  return out;
}

int GpuCount(const std::string& text) {
  int total = 0;
  for (const auto& [type, n] : GpusByType(text)) total += n;
  return total;
}

namespace {
// The type a job asks for: the first typed gpu entry, "" when it takes any GPU.
std::string JobGpuType(const std::string& text) {
  for (const auto& [type, n] : GpusByType(text)) {
    if (!type.empty()) return type;
  }
  return "";
}
}  // namespace

Result<std::map<std::string, SlurmNode>> ParseSinfoJson(const std::string& text, TimeMs now) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return Status(ErrorCode::kUnavailable, "sinfo --json: not JSON");
  if (Status s = CheckErrors(j, "sinfo --json"); !s.ok()) return s;
  if (!j.contains("nodes") || !j["nodes"].is_array()) {
    return Status(ErrorCode::kUnavailable, "sinfo --json: no nodes array");
  }
  std::map<std::string, SlurmNode> out;
  for (const json& n : j["nodes"]) {
    SlurmNode node;
    node.name = StringOr(n, "name");
    if (node.name.empty())
      return Status(ErrorCode::kUnavailable, "sinfo --json: node without name");
    // 22.05: "state":"idle","state_flags":["DRAIN"]; 23.x: "state":["IDLE","DRAIN"].
    const json& st = n.contains("state") ? n["state"] : json();
    if (st.is_string()) {
      node.state = Lower(st.get<std::string>());
    } else if (st.is_array() && !st.empty() && st[0].is_string()) {
      node.state = Lower(st[0].get<std::string>());
      for (size_t i = 1; i < st.size(); ++i) {
        if (st[i].is_string()) node.flags.insert(Upper(st[i].get<std::string>()));
      }
    } else {
      return Status(ErrorCode::kUnavailable, "sinfo --json: node " + node.name + ": no state");
    }
    if (n.contains("state_flags") && n["state_flags"].is_array()) {
      for (const json& f : n["state_flags"]) {
        if (f.is_string()) node.flags.insert(Upper(f.get<std::string>()));
      }
    }
    node.reason = StringOr(n, "reason");
    node.gpu_types = GpusByType(StringOr(n, "gres"));
    for (const auto& [type, count] : node.gpu_types) node.gpus += count;
    node.gpus_used = GpuCount(StringOr(n, "gres_used"));
    node.alloc_cpus = IntOr(n.value("alloc_cpus", json()), 0);
    const int busy = IntOr(n.value("last_busy", json()), 0);
    node.last_busy = busy > 0 ? static_cast<TimeMs>(busy) * 1000 : now;
    out[node.name] = std::move(node);
  }
  return out;
}

Result<std::vector<SlurmJob>> ParseSqueueJson(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return Status(ErrorCode::kUnavailable, "squeue --json: not JSON");
  if (Status s = CheckErrors(j, "squeue --json"); !s.ok()) return s;
  if (!j.contains("jobs") || !j["jobs"].is_array()) {
    return Status(ErrorCode::kUnavailable, "squeue --json: no jobs array");
  }
  std::vector<SlurmJob> out;
  out.reserve(j["jobs"].size());
  for (const json& job : j["jobs"]) {
    SlurmJob s;
    const json& id = job.contains("job_id") ? job["job_id"] : json();
    if (!id.is_number_integer()) {
      return Status(ErrorCode::kUnavailable, "squeue --json: job without job_id");
    }
    s.id = std::to_string(id.get<long long>());
    const json& st = job.contains("job_state") ? job["job_state"] : json();
    if (st.is_string()) {
      s.state = st.get<std::string>();
    } else if (st.is_array() && !st.empty() && st[0].is_string()) {
      s.state = st[0].get<std::string>();
    } else {
      return Status(ErrorCode::kUnavailable, "squeue --json: job " + s.id + ": no job_state");
    }
    s.reason = StringOr(job, "state_reason");
    s.node_count = std::max(1, IntOr(job.value("node_count", json()), 1));
    s.gpus_per_node = GpuCount(StringOr(job, "tres_per_node"));
    s.gpus_per_job = GpuCount(StringOr(job, "tres_per_job"));
    s.gpu_type = JobGpuType(StringOr(job, "tres_per_node"));
    if (s.gpu_type.empty()) s.gpu_type = JobGpuType(StringOr(job, "tres_per_job"));
    bool ok = true;
    s.required_nodes = ExpandHostlist(StringOr(job, "required_nodes"), &ok);
    if (!ok) {
      return Status(ErrorCode::kUnavailable, "squeue --json: job " + s.id + ": bad required_nodes");
    }
    for (const char* key : {"sched_nodes", "scheduled_nodes"}) {
      std::set<std::string> planned = ExpandHostlist(StringOr(job, key), &ok);
      if (!ok)
        return Status(ErrorCode::kUnavailable, "squeue --json: job " + s.id + ": bad " + key);
      s.sched_nodes.insert(planned.begin(), planned.end());
    }
    out.push_back(std::move(s));
  }
  return out;
}

Result<std::vector<Reservation>> ParseReservations(const std::string& text) {
  std::vector<Reservation> out;
  std::stringstream lines(text);
  std::string line;
  auto parse_time = [](const std::string& v, TimeMs* t) {
    std::tm tm{};
    std::istringstream in(v);
    in >> std::get_time(&tm, "%Y-%m-%dT%H:%M:%S");
    if (in.fail()) return false;
    tm.tm_isdst = -1;
    *t = static_cast<TimeMs>(std::mktime(&tm)) * 1000;
    return true;
  };
  while (std::getline(lines, line)) {
    if (line.find("ReservationName=") == std::string::npos) continue;
    Reservation r;
    std::stringstream fields(line);
    std::string f;
    bool have_start = false, have_end = false, ok = true;
    while (fields >> f) {
      const size_t eq = f.find('=');
      if (eq == std::string::npos) continue;
      const std::string k = f.substr(0, eq), v = f.substr(eq + 1);
      if (k == "ReservationName") r.name = v;
      if (k == "Nodes") r.nodes = ExpandHostlist(v, &ok);
      if (k == "StartTime") have_start = parse_time(v, &r.start);
      if (k == "EndTime") have_end = parse_time(v, &r.end);
    }
    if (!ok || !have_start || !have_end || r.name.empty()) {
      return Status(ErrorCode::kUnavailable,
                    "scontrol show reservation: cannot parse \"" + line.substr(0, 120) + "\"");
    }
    out.push_back(std::move(r));
  }
  return out;
}

SlurmSide::SlurmSide(std::shared_ptr<const slurm::CommandRunner> runner, const BrokerConfig& config)
    : runner_(std::move(runner)),
      config_(config),
      client_(runner_, config.scontrol, std::chrono::milliseconds(config.command_timeout)) {}

Result<std::string> SlurmSide::RunJson(const std::vector<std::string>& argv) const {
  std::string what;
  for (const auto& a : argv) what += (what.empty() ? "" : " ") + a;
  Result<slurm::CommandOutput> r =
      runner_->Run(argv, std::chrono::milliseconds(config_.command_timeout));
  if (!r.ok()) return Status(r.status().code(), what + ": " + r.status().message());
  if (r->exit_code != 0) {
    std::string msg = r->err.empty() ? r->out : r->err;
    while (!msg.empty() && std::isspace(static_cast<unsigned char>(msg.back()))) msg.pop_back();
    return Status(ErrorCode::kUnavailable,
                  what + ": exit " + std::to_string(r->exit_code) + ": " + msg.substr(0, 300));
  }
  return r->out;
}

SlurmView SlurmSide::Observe(TimeMs now) const {
  SlurmView v;
  auto fail = [&](const Status& s) {
    v.ok = false;
    v.error = s.message();
    v.nodes.clear();
    v.jobs.clear();
    return v;
  };
  Result<std::string> nodes = RunJson({config_.sinfo, "--json"});
  if (!nodes.ok()) return fail(nodes.status());
  auto parsed = ParseSinfoJson(*nodes, now);
  if (!parsed.ok()) return fail(parsed.status());
  v.nodes = std::move(*parsed);
  Result<std::string> jobs = RunJson({config_.squeue, "--json"});
  if (!jobs.ok()) return fail(jobs.status());
  auto pj = ParseSqueueJson(*jobs);
  if (!pj.ok()) return fail(pj.status());
  v.jobs = std::move(*pj);
  Result<std::string> res = RunJson({config_.scontrol, "show", "reservation", "-o"});
  if (!res.ok()) return fail(res.status());
  auto pr = ParseReservations(*res);
  if (!pr.ok()) return fail(pr.status());
  v.reservations = std::move(*pr);
  v.ok = true;
  return v;
}

Status SlurmSide::Drain(const std::string& node, const std::string& reason) const {
  return client_.Drain(node, reason);
}

Result<bool> SlurmSide::ResumeIfOurs(const std::string& node, const std::string& prefix) const {
  Result<slurm::NodeStatus> st = client_.ShowNode(node);
  if (!st.ok()) return st.status();
  if (!st->drained() || st->reason.rfind(prefix, 0) != 0) return false;
  Status s = client_.Resume(node);
  if (!s.ok()) return s;
  return true;
}

}  // namespace gpulet::broker
