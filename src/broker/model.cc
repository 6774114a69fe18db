#include "broker/model.h"

#include <algorithm>
#include <cctype>
#include <vector>

namespace gpulet::broker {

int SlurmNode::GpusOfType(const std::string& type) const {
  if (type.empty()) return gpus;
  auto it = gpu_types.find(type);
  return it == gpu_types.end() ? 0 : it->second;
}

bool SlurmNode::ReasonIsOurs() const { return reason.rfind(kBrokerReasonPrefix, 0) == 0; }

bool SlurmNode::Drained() const {
  return HasFlag("DRAIN") && state == "idle" && !HasFlag("COMPLETING") && alloc_cpus == 0 &&
         gpus_used == 0;
}

int SlurmJob::TotalGpus() const {
  return std::max(gpus_per_job, gpus_per_node * std::max(node_count, 1));
}

const char* OwnerName(Owner o) {
  switch (o) {
    case Owner::kSlurm:
      return "slurm";
    case Owner::kLending:
      return "lending";
    case Owner::kKubernetes:
      return "kubernetes";
    case Owner::kReturning:
      return "returning";
  }
  return "?";
}

bool ParseOwner(const std::string& text, Owner* out) {
  for (Owner o : {Owner::kSlurm, Owner::kLending, Owner::kKubernetes, Owner::kReturning}) {
    if (text == OwnerName(o)) {
      *out = o;
      return true;
    }
  }
  return false;
}

int Journal::Lent() const {
  int n = 0;
  for (const auto& [name, e] : nodes) {
    if (e.owner == Owner::kKubernetes || e.owner == Owner::kReturning) ++n;
  }
  return n;
}

int Journal::InTransit() const {
  int n = 0;
  for (const auto& [name, e] : nodes) {
    if (e.owner == Owner::kLending || e.owner == Owner::kReturning) ++n;
  }
  return n;
}

namespace {

// Splits at commas that are outside brackets.
std::vector<std::string> SplitTop(const std::string& text, bool* ok) {
  std::vector<std::string> parts;
  std::string cur;
  int depth = 0;
  for (char c : text) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0 || depth > 1) *ok = false;
    if (c == ',' && depth == 0) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  if (depth != 0) *ok = false;
  parts.push_back(cur);
  return parts;
}

}  // namespace

std::set<std::string> ExpandHostlist(const std::string& text, bool* ok_out) {
  bool ok = true;
  std::set<std::string> out;
  if (text.empty() || text == "(null)") {
    if (ok_out) *ok_out = true;
    return out;
  }
  for (const std::string& part : SplitTop(text, &ok)) {
    if (part.empty()) continue;
    const size_t open = part.find('[');
    if (open == std::string::npos) {
      out.insert(part);
      continue;
    }
    const size_t close = part.find(']', open);
    if (close == std::string::npos) {
      ok = false;
      break;
    }
    const std::string prefix = part.substr(0, open), suffix = part.substr(close + 1);
    std::string ranges = part.substr(open + 1, close - open - 1);
    size_t start = 0;
    while (start <= ranges.size()) {
      size_t comma = ranges.find(',', start);
      if (comma == std::string::npos) comma = ranges.size();
      const std::string r = ranges.substr(start, comma - start);
      start = comma + 1;
      const size_t dash = r.find('-');
      const std::string lo = r.substr(0, dash);
      const std::string hi = dash == std::string::npos ? lo : r.substr(dash + 1);
      auto digits = [](const std::string& s) {
        if (s.empty() || s.size() > 9) return false;
        for (char c : s) {
          if (!std::isdigit(static_cast<unsigned char>(c))) return false;
        }
        return true;
      };
      if (!digits(lo) || !digits(hi)) {
        ok = false;
        break;
      }
      const long a = std::stol(lo), b = std::stol(hi);
      if (b < a || b - a > 100000) {
        ok = false;
        break;
      }
      for (long i = a; i <= b; ++i) {
        std::string num = std::to_string(i);
        if (num.size() < lo.size()) num = std::string(lo.size() - num.size(), '0') + num;
        out.insert(prefix + num + suffix);
      }
      if (comma == ranges.size()) break;
    }
    if (!ok) break;
  }
  if (ok_out) *ok_out = ok;
  if (!ok) out.clear();
  return out;
}

}  // namespace gpulet::broker
