#include "slurm/jobs.h"

#include <spdlog/spdlog.h>

#include <set>
#include <sstream>

#include "slurm/id_list.h"

namespace gpulet::slurm {
namespace {

// "a,b(x,y),c" → {"a", "b(x,y)", "c"}.
std::vector<std::string> SplitOutsideParens(const std::string& s) {
  std::vector<std::string> parts;
  std::string cur;
  int depth = 0;
  for (char c : s) {
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (c == ',' && depth == 0) {
      if (!cur.empty()) parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) parts.push_back(cur);
  return parts;
}

// Expands a Slurm node list ("n[1-3],gpu7") enough to test membership.
bool NodeListHas(const std::string& list, const std::string& node) {
  std::vector<std::string> items;
  std::string cur;
  int depth = 0;
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      items.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  items.push_back(cur);
  for (const std::string& item : items) {
    size_t open = item.find('[');
    if (open == std::string::npos) {
      if (item == node) return true;
      continue;
    }
    size_t close = item.find(']', open);
    if (close == std::string::npos) continue;
    std::string prefix = item.substr(0, open), suffix = item.substr(close + 1);
    if (node.rfind(prefix, 0) != 0 || node.size() < prefix.size() + suffix.size()) continue;
    if (node.compare(node.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    std::string digits = node.substr(prefix.size(), node.size() - prefix.size() - suffix.size());
    std::stringstream ranges(item.substr(open + 1, close - open - 1));
    std::string range;
    while (std::getline(ranges, range, ',')) {
      size_t dash = range.find('-');
      std::string lo = range.substr(0, dash);
      std::string hi = dash == std::string::npos ? lo : range.substr(dash + 1);
      auto d = ParseIdList(digits), l = ParseIdList(lo), h = ParseIdList(hi);
      if (!d || !l || !h || d->size() != 1 || l->size() != 1 || h->size() != 1) continue;
      // "n[01-03]" names n01..n03: the digits carry the range's zero padding, nothing else.
      std::string canonical = std::to_string(*d->begin());
      if (canonical.size() < lo.size()) canonical.insert(0, lo.size() - canonical.size(), '0');
      if (digits != canonical) continue;
      if (*d->begin() >= *l->begin() && *d->begin() <= *h->begin()) return true;
    }
  }
  return false;
}

bool Holds(const std::string& state) {
  return state == "RUNNING" || state == "SUSPENDED" || state == "COMPLETING";
}

}  // namespace

Result<JobsByGpuMap> ParseJobGpus(
    const std::string& text, const std::string& node_name,
    const std::map<std::string, std::vector<unsigned>>& gpu_of_index) {
  // (length, id) sorts numeric ids numerically.
  std::map<unsigned, std::set<std::pair<size_t, std::string>>> holders;
  std::stringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::stringstream tokens(line);
    std::string tok, job, state;
    bool node_matches = false;
    while (tokens >> tok) {
      size_t eq = tok.find('=');
      if (eq == std::string::npos) continue;
      std::string key = tok.substr(0, eq), value = tok.substr(eq + 1);
      if (key == "JobId") {
        job = value;
      } else if (key == "JobState") {
        state = value;
      } else if (key == "Nodes") {
        node_matches = NodeListHas(value, node_name);
      } else if (key == "GRES" && node_matches && Holds(state) && !job.empty()) {
        for (const std::string& item : SplitOutsideParens(value)) {
          size_t idx = item.find("(IDX:");
          if (idx == std::string::npos) continue;  // no device indexes (e.g. a license-like GRES)
          size_t close = item.find(')', idx);
          std::string name = item.substr(0, std::min(item.find(':'), idx));
          auto ids = ParseIdList(item.substr(
              idx + 5, close == std::string::npos ? std::string::npos : close - idx - 5));
          if (close == std::string::npos || !ids) {
            return Status(ErrorCode::kInvalidInput, "scontrol show job -d: job " + job +
                                                        ": cannot read GRES \"" + item + "\"");
          }
          auto map = gpu_of_index.find(name);
          for (unsigned i : *ids) {
            unsigned gpu = map != gpu_of_index.end() && i < map->second.size() ? map->second[i] : i;
            holders[gpu].emplace(job.size(), job);
          }
        }
      }
    }
  }
  JobsByGpuMap out;
  for (const auto& [gpu, jobs] : holders) {
    std::string v;
    for (const auto& j : jobs) v += (v.empty() ? "" : ",") + j.second;
    out[gpu] = v;
  }
  return out;
}

std::map<std::string, std::vector<unsigned>> GresGpuIndexes(const gpu::Inventory& inventory,
                                                            const NodeGres& gres) {
  // Records carry device paths; map each back to its GPU through the /dev/nvidia<minor> suffix.
  std::map<std::string, unsigned> gpu_by_dev_suffix;
  for (const gpu::Gpu& g : inventory.gpus) gpu_by_dev_suffix[g.device_path()] = g.index;
  std::map<std::string, std::vector<unsigned>> out;
  for (const GresRecord& r : gres.records) {
    if (r.files.empty()) continue;
    const std::string& dev = r.files.front();
    unsigned gpu = 0;
    for (const auto& [suffix, index] : gpu_by_dev_suffix) {
      if (dev.size() >= suffix.size() &&
          dev.compare(dev.size() - suffix.size(), suffix.size(), suffix) == 0) {
        gpu = index;
      }
    }
    out[r.name].push_back(gpu);
  }
  return out;
}

JobMapper::JobMapper(std::shared_ptr<const CommandRunner> runner, JobMapperOptions options,
                     std::map<std::string, std::vector<unsigned>> gpu_of_index, Clock& clock)
    : client_(std::move(runner), options.scontrol),
      options_(std::move(options)),
      gpu_of_index_(std::move(gpu_of_index)),
      clock_(clock) {}

JobMapper::~JobMapper() { Stop(); }

std::unique_ptr<JobMapper> JobMapper::ForNode(const gpu::Inventory& inventory,
                                              JobMapperOptions options) {
  GresOptions g;
  g.node_name = options.node_name;
  g.mps = true;
  g.shards = 1;
  std::map<std::string, std::vector<unsigned>> indexes;
  if (Result<NodeGres> plan = PlanNodeGres(inventory, g); plan.ok()) {
    indexes = GresGpuIndexes(inventory, *plan);
  }
  return std::make_unique<JobMapper>(std::make_shared<ProcessRunner>(), std::move(options),
                                     std::move(indexes));
}

Status JobMapper::Refresh() {
  Result<std::string> text = client_.ShowJobsDetail();
  if (!text.ok()) return text.status();
  Result<JobsByGpuMap> jobs = ParseJobGpus(*text, options_.node_name, gpu_of_index_);
  if (!jobs.ok()) return jobs.status();
  std::lock_guard<std::mutex> lock(mu_);
  jobs_ = std::move(jobs).value();
  return Status::Ok();
}

void JobMapper::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (thread_.joinable()) return;
  stop_ = std::make_unique<StopSignal>();
  thread_ = std::thread([this, stop = stop_.get()] { Run(*stop); });
}

void JobMapper::Stop() {
  StopSignal* stop = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop = stop_.get();
  }
  if (stop != nullptr) stop->Stop();
  if (thread_.joinable()) thread_.join();
}

JobsByGpuMap JobMapper::JobsByGpu() const {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_;
}

void JobMapper::Run(StopSignal& stop) {
  bool failing = false;
  while (true) {
    Status s = Refresh();
    if (!s.ok() && !failing) {
      spdlog::warn("event=slurm_jobs_refresh_failed node={} error=\"{}\"", options_.node_name,
                   s.message());
    } else if (s.ok() && failing) {
      spdlog::info("event=slurm_jobs_refresh_recovered node={}", options_.node_name);
    }
    failing = !s.ok();
    if (!clock_.SleepFor(options_.refresh, stop)) return;
  }
}

}  // namespace gpulet::slurm
