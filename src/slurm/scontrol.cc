#include "slurm/scontrol.h"

#include <algorithm>
#include <sstream>

namespace gpulet::slurm {
namespace {

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\n')) ++i;
  return s.substr(i);
}

bool Contains(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

// The value of ` Key=` up to the next space in a one-line record.
std::string Field(const std::string& line, const std::string& key) {
  const std::string needle = key + "=";
  size_t start;
  if (line.rfind(needle, 0) == 0) {
    start = needle.size();
  } else {
    size_t at = line.find(" " + needle);
    if (at == std::string::npos) return "";
    start = at + 1 + needle.size();
  }
  size_t end = line.find(' ', start);
  return line.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

}  // namespace

bool NodeStatus::drained() const {
  std::stringstream in(state);
  std::string flag;
  while (std::getline(in, flag, '+')) {
    if (flag == "DRAIN" || flag == "DRAINED" || flag == "DRAINING") return true;
  }
  return false;
}

bool NodeStatus::ours() const { return reason.rfind(kReasonPrefix, 0) == 0; }

Result<NodeStatus> ParseNodeStatus(const std::string& text) {
  std::string line = Trim(text);
  if (size_t nl = line.find('\n'); nl != std::string::npos) line.resize(nl);
  NodeStatus s;
  s.name = Field(line, "NodeName");
  s.state = Field(line, "State");
  s.slurmd_start_time = Field(line, "SlurmdStartTime");
  if (s.name.empty() || s.state.empty()) {
    return Status(ErrorCode::kInvalidInput,
                  "scontrol show node: no NodeName/State in \"" + line.substr(0, 120) + "\"");
  }
  // Reason is free text and runs to the end of the record; Slurm appends " [user@time]".
  if (size_t r = line.find(" Reason="); r != std::string::npos) {
    std::string reason = line.substr(r + 8);
    if (size_t stamp = reason.rfind(" ["); stamp != std::string::npos && reason.back() == ']') {
      reason.resize(stamp);
    }
    s.reason = Trim(reason);
  }
  return s;
}

SlurmClient::SlurmClient(std::shared_ptr<const CommandRunner> runner, std::string scontrol,
                         std::chrono::milliseconds timeout)
    : runner_(std::move(runner)), scontrol_(std::move(scontrol)), timeout_(timeout) {}

Result<CommandOutput> SlurmClient::Call(const std::vector<std::string>& args) const {
  std::vector<std::string> argv{scontrol_};
  argv.insert(argv.end(), args.begin(), args.end());
  Result<CommandOutput> r = runner_->Run(argv, timeout_);
  if (!r.ok()) return r.status();
  if (r->exit_code == 0) return r;
  std::string what = "scontrol";
  for (const std::string& a : args) what += " " + a;
  std::string msg = Trim(r->err.empty() ? r->out : r->err);
  if (Contains(msg, "Unable to contact") || Contains(msg, "Connection refused") ||
      Contains(msg, "timed out") || Contains(msg, "Zero Bytes were transmitted")) {
    return Status(ErrorCode::kUnavailable, what + ": slurmctld not reachable: " + msg);
  }
  if (Contains(msg, "Invalid node name") || Contains(msg, "not found")) {
    return Status(ErrorCode::kNotFound, what + ": " + msg);
  }
  return Status(ErrorCode::kInternal, what + ": exit " + std::to_string(r->exit_code) + ": " + msg);
}

Result<NodeStatus> SlurmClient::ShowNode(const std::string& node) const {
  Result<CommandOutput> r = Call({"show", "node", "-o", node});
  if (!r.ok()) return r.status();
  if (Trim(r->out).empty()) {
    return Status(ErrorCode::kNotFound, "scontrol show node " + node + ": no such node");
  }
  return ParseNodeStatus(r->out);
}

Status SlurmClient::Drain(const std::string& node, const std::string& reason) const {
  Result<CommandOutput> r = Call({"update", "NodeName=" + node, "State=DRAIN", "Reason=" + reason});
  return r.status();
}

Status SlurmClient::Resume(const std::string& node) const {
  Result<CommandOutput> r = Call({"update", "NodeName=" + node, "State=RESUME"});
  return r.status();
}

Result<std::string> SlurmClient::ShowJobsDetail() const {
  Result<CommandOutput> r = Call({"show", "job", "-d", "-o"});
  if (!r.ok()) return r.status();
  return r->out;
}

}  // namespace gpulet::slurm
