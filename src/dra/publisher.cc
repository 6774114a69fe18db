#include "dra/publisher.h"

#include <malloc.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <functional>
#include <set>
#include <thread>
#include <vector>

#include "common/fnv.h"
#include "dra/names.h"

namespace gpulet::dra {

namespace {

std::vector<std::string> Serialized(const std::vector<nlohmann::json>& slices) {
  std::vector<std::string> out;
  out.reserve(slices.size());
  for (const nlohmann::json& s : slices) out.push_back(s.dump());
  return out;
}

using nlohmann::json;

// FNV-1a of a spec's serialized form (expected_). The specs compared are ours and what the API
// server echoes of them: an accidental match of different specs is a 2^-64 event, and whoever
// could craft one can write this node's slices anyway, which the admission policy reserves to
// this node's agent.
uint64_t SpecDigest(const json& spec) { return Fnv1a64(spec.dump()); }

constexpr char kSlices[] = "/apis/resource.k8s.io/v1/resourceslices";

std::string Selector(const std::string& node) {
  return "fieldSelector=" +
         k8s::EscapeQueryValue("spec.nodeName=" + node + ",spec.driver=" + kDriverName);
}

std::string NameOf(const json& o) {
  return o.contains("metadata") && o["metadata"].is_object() ? o["metadata"].value("name", "")
                                                             : "";
}

int64_t GenerationOf(const json& o) {
  if (!o.contains("spec") || !o["spec"].contains("pool")) return 0;
  const json& g = o["spec"]["pool"].value("generation", json(0));
  return g.is_number_integer() ? g.get<int64_t>() : 0;
}

// The spec without the pool's generation: what "the same content" compares.
json Content(const json& o) {
  json spec = o.value("spec", json::object());
  if (spec.contains("pool") && spec["pool"].is_object()) spec["pool"].erase("generation");
  return spec;
}

// Runs every task, each on its own thread (a pool has a handful of slices); returns the first
// failure in task order, or OK.
Status RunAll(const std::vector<std::function<Status()>>& tasks) {
  std::vector<Status> results(tasks.size());
  std::vector<std::thread> threads;
  threads.reserve(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = tasks[i](); });
  }
  for (std::thread& t : threads) t.join();
  for (const Status& s : results) {
    if (!s.ok()) return s;
  }
  return {};
}

}  // namespace

SlicePublisher::SlicePublisher(const k8s::Client& client, PublisherOptions options)
    : client_(client), options_(std::move(options)) {}

SlicePublisher::~SlicePublisher() { Stop(); }

void SlicePublisher::MarkDirty() {
  dirty_ = true;
  cv_.notify_all();
}

void SlicePublisher::SetDevices(std::shared_ptr<const gpu::Inventory> inventory,
                                std::vector<mig::GpuState> mig) {
  std::lock_guard<std::mutex> lock(mu_);
  inventory_ = std::move(inventory);
  mig_ = std::move(mig);
  ++input_version_;
  MarkDirty();
}

void SlicePublisher::SetHealth(const gpu::HealthSnapshot& health) {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, GpuTaint> taints;
  const auto now = std::chrono::system_clock::now();
  for (const auto& [uuid, h] : health.devices) {
    // Physical GPUs only: a MIG device's own event does not make its parent unschedulable.
    if (h.healthy || uuid.rfind("GPU-", 0) != 0) continue;
    auto it = taints_.find(uuid);
    const auto since = it != taints_.end() ? it->second.since : now;
    taints[uuid] = GpuTaint{h.reason, since};
  }
  auto same = [](const std::map<std::string, GpuTaint>& a,
                 const std::map<std::string, GpuTaint>& b) {
    if (a.size() != b.size()) return false;
    for (auto ia = a.begin(), ib = b.begin(); ia != a.end(); ++ia, ++ib) {
      if (ia->first != ib->first || ia->second.reason != ib->second.reason) return false;
    }
    return true;
  };
  if (same(taints, taints_)) return;
  taints_ = std::move(taints);
  ++input_version_;
  MarkDirty();
}

void SlicePublisher::SetGpuUsage(std::vector<int32_t> used_milli) {
  std::lock_guard<std::mutex> lock(mu_);
  if (used_milli == used_milli_) return;
  used_milli_ = std::move(used_milli);
  ++input_version_;
  MarkDirty();
}

uint64_t SlicePublisher::input_version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return input_version_;
}

bool SlicePublisher::WaitPublished(uint64_t version, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return stats_.published_input >= version; });
}

PublisherStats SlicePublisher::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::vector<nlohmann::json> SlicePublisher::desired() const {
  std::vector<std::string> text;
  {
    std::lock_guard<std::mutex> lock(mu_);
    text = desired_;
  }
  std::vector<nlohmann::json> out;
  out.reserve(text.size());
  for (const std::string& t : text) out.push_back(nlohmann::json::parse(t));
  return out;
}

Status SlicePublisher::PublishOnce() {
  std::lock_guard<std::mutex> pass(pass_mu_);
  return Pass();
}

// One pass (caller holds pass_mu_); see the header.
Status SlicePublisher::Pass() {
  SliceInputs in;
  std::shared_ptr<const gpu::Inventory> inventory;
  SliceOptions so = options_.slices;
  uint64_t version = 0;
  int64_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.passes;
    inventory = inventory_;
    in.mig = mig_;
    in.taints = taints_;
    in.gpu_used_milli = used_milli_;
    version = input_version_;
    generation = generation_;
    if (so.node_uid.empty()) so.node_uid = node_uid_;
  }
  // A failed request, with the server's Retry-After (the next pass waits at least that long).
  auto failed = [&](Status s, std::chrono::seconds retry_after = std::chrono::seconds(0)) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.failed_requests;
    retry_after_ = std::max(retry_after_, retry_after);
    return s;
  };
  if (!inventory) return Status(ErrorCode::kUnavailable, "slices: no inventory yet");
  in.inventory = inventory.get();
  if (so.node_uid.empty()) {
    k8s::ApiResult<json> node = client_.Get("/api/v1/nodes/" + so.node_name);
    if (!node.ok()) return failed(node.status(), node.retry_after());
    so.node_uid = (*node)["metadata"].value("uid", "");
    if (so.node_uid.empty()) {
      return failed(Status(ErrorCode::kUnavailable, "node " + so.node_name + " has no uid"));
    }
    std::lock_guard<std::mutex> lock(mu_);
    node_uid_ = so.node_uid;
  }
  k8s::ApiResult<json> list =
      client_.Get(std::string(kSlices) + "?" + Selector(so.node_name));
  if (!list.ok()) return failed(list.status(), list.retry_after());
  std::map<std::string, json> existing;
  for (const json& item : list->value("items", json::array())) {
    // The selector is the server's; check it here too (a stand-in or an old server may ignore
    // part of it, and deleting another driver's slice would be wrong).
    if (!item.contains("spec") || item["spec"].value("driver", "") != kDriverName ||
        item["spec"].value("nodeName", "") != so.node_name) {
      continue;
    }
    existing[NameOf(item)] = item;
    generation = std::max(generation, GenerationOf(item));
  }
  Result<std::vector<json>> want = BuildSlices(in, so, generation);
  if (!want.ok()) return want.status();
  bool current = want->size() == existing.size() && generation > 0;
  for (const json& d : *want) {
    if (!current) break;
    auto it = existing.find(NameOf(d));
    current = it != existing.end() && GenerationOf(it->second) == generation &&
              Content(it->second) == Content(d);
  }
  if (current) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const json& d : *want) expected_[NameOf(d)] = SpecDigest(d["spec"]);
    desired_ = Serialized(*want);
    stats_.published_input = std::max(stats_.published_input, version);
    stats_.generation = generation;
    cv_.notify_all();
    return {};
  }
  // A new generation: every desired slice written at it, then the rest deleted.
  ++generation;
  for (json& d : *want) d["spec"]["pool"]["generation"] = generation;
  std::set<std::string> names;
  std::vector<std::function<Status()>> writes, deletes;
  for (const json& d : *want) {
    const std::string name = NameOf(d);
    names.insert(name);
    const bool exists = existing.count(name) > 0;
    writes.push_back([this, &d, name, exists, generation, &failed]() -> Status {
      const std::string path = std::string(kSlices) + "/" + name;
      const json patch = json::array({{{"op", "replace"}, {"path", "/spec"}, {"value", d["spec"]}}});
      k8s::ApiResult<json> res = Status(ErrorCode::kInternal, "unset");
      if (exists) {
        res = client_.Patch(path, patch, k8s::PatchType::kJsonPatch, k8s::Answer::kNothing);
        if (!res.ok() && res.http_status() == 404) {
          res = client_.Post(kSlices, d, k8s::Answer::kNothing);
        }
      } else {
        res = client_.Post(kSlices, d, k8s::Answer::kNothing);
        if (!res.ok() && res.http_status() == 409) {
          res = client_.Patch(path, patch, k8s::PatchType::kJsonPatch, k8s::Answer::kNothing);
        }
      }
      if (!res.ok()) {
        spdlog::warn("dra: publishing ResourceSlice {} (generation {}): {}", name, generation,
                     res.status().message());
        return failed(res.status(), res.retry_after());
      }
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.writes;
      return {};
    });
  }
  for (const auto& [name, obj] : existing) {
    if (names.count(name)) continue;
    deletes.push_back([this, name = name, &failed]() -> Status {
      k8s::ApiResult<json> res = client_.Delete(std::string(kSlices) + "/" + name);
      if (!res.ok() && res.http_status() != 404) {
        spdlog::warn("dra: deleting ResourceSlice {}: {}", name, res.status().message());
        return failed(res.status(), res.retry_after());
      }
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.writes;
      return {};
    });
  }
  {
    // Before any request: the watch must know these specs as ours when their events arrive.
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [name, obj] : existing) {
      if (!names.count(name)) expected_.erase(name);
    }
    for (const json& d : *want) expected_[NameOf(d)] = SpecDigest(d["spec"]);
  }
  // The slices of the new generation are written side by side (each request is its own TLS
  // connection: in sequence, a pool of 8 GPUs took 7 round trips per change), then the obsolete
  // ones deleted. The first failure is the pass's.
  for (std::vector<std::function<Status()>>* batch : {&writes, &deletes}) {
    Status first = RunAll(*batch);
    if (!first.ok()) return first;
    if (batch == &writes) {
      std::lock_guard<std::mutex> lock(mu_);
      generation_ = std::max(generation_, generation);
    }
  }
  std::vector<std::string> serialized = Serialized(*want);
  std::lock_guard<std::mutex> lock(mu_);
  desired_ = std::move(serialized);
  ++stats_.publications;
  stats_.generation = generation;
  stats_.published_input = std::max(stats_.published_input, version);
  cv_.notify_all();
  spdlog::info("dra: published {} ResourceSlices of pool {} at generation {}", names.size(),
               so.node_name, generation);
  return {};
}

void SlicePublisher::Run() {
  std::chrono::milliseconds backoff = options_.initial_backoff;
  auto next_resync = std::chrono::steady_clock::now() + options_.resync;
  std::string failing;  // the last pass's error, empty after a success
  while (!stop_) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto until = retry_at_ ? *retry_at_ : next_resync;
      cv_.wait_until(lock, until, [&] {
        return stop_.load() || (dirty_ && !retry_at_) ||
               std::chrono::steady_clock::now() >= until;
      });
      if (stop_) return;
      dirty_ = false;
      retry_at_.reset();
    }
    Status s;
    {
      std::lock_guard<std::mutex> pass(pass_mu_);
      s = Pass();
    }
    // A pass parses the listed slices, builds the wanted ones and the server's answers: megabytes
    // of JSON trees for a large node, all freed by now. glibc keeps freed pages in its arenas
    // unless asked; this gives them back, so the driver's RSS between changes is what it holds.
    malloc_trim(0);
    const auto now = std::chrono::steady_clock::now();
    // One line when publishing starts failing and one when it works again, not one per retry.
    if (!s.ok() && failing.empty()) {
      spdlog::warn("dra: ResourceSlices of {} not published, retrying: {}",
                   options_.slices.node_name, s.message());
    } else if (s.ok() && !failing.empty()) {
      spdlog::info("dra: ResourceSlices of {} published again", options_.slices.node_name);
    }
    failing = s.ok() ? "" : s.message();
    if (s.ok()) {
      backoff = options_.initial_backoff;
      next_resync = now + options_.resync;
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    // The backoff, or longer when the API server asked for it (429/503 Retry-After).
    retry_at_ = now + std::max<std::chrono::milliseconds>(backoff, retry_after_);
    retry_after_ = std::chrono::seconds(0);
    dirty_ = true;
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

void SlicePublisher::WatchLoop() {
  const std::string path = std::string(kSlices) + "?watch=1&" +
                           Selector(options_.slices.node_name) +
                           "&timeoutSeconds=" + std::to_string(options_.watch_timeout_seconds);
  std::chrono::milliseconds backoff = options_.initial_backoff;
  while (!watch_stop_) {
    bool delivered = false;
    k8s::WatchResult r = client_.Watch(
        path,
        [&](const k8s::WatchEvent& e) {
          delivered = true;
          if (e.type != "ADDED" && e.type != "MODIFIED" && e.type != "DELETED") return true;
          const std::string name = NameOf(e.object);
          // Serialized and hashed before the lock: a slice's spec is tens of KiB.
          const std::optional<uint64_t> digest =
              e.object.contains("spec") ? std::optional(SpecDigest(e.object["spec"])) : std::nullopt;
          std::lock_guard<std::mutex> lock(mu_);
          auto it = expected_.find(name);
          const bool wanted = it != expected_.end();
          const bool ours = wanted && digest == it->second;
          if ((e.type == "DELETED" && wanted) || (e.type != "DELETED" && !ours)) {
            if (e.type == "DELETED") ++stats_.wipes_seen;
            MarkDirty();
          }
          return true;
        },
        &watch_stop_);
    if (watch_stop_) return;
    {
      // Events may have been missed between streams: one pass finds out.
      std::lock_guard<std::mutex> lock(mu_);
      MarkDirty();
    }
    if (r.end != k8s::WatchEnd::kClosed || !delivered) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, backoff, [&] { return watch_stop_.load(); });
      backoff = std::min(backoff * 2, options_.max_backoff);
    } else {
      backoff = options_.initial_backoff;
    }
  }
}

Status SlicePublisher::Start() {
  {
    // Options BuildSlices would refuse are refused here, before any thread starts.
    gpu::Inventory empty;
    SliceInputs in;
    in.inventory = &empty;
    Result<std::vector<json>> check = BuildSlices(in, options_.slices, 0);
    if (!check.ok()) return check.status();
  }
  if (thread_.joinable()) return {};
  stop_ = false;
  watch_stop_ = false;
  thread_ = std::thread([this] { Run(); });
  watch_thread_ = std::thread([this] { WatchLoop(); });
  return {};
}

void SlicePublisher::FollowHealth(const gpu::HealthBoard& board) {
  if (health_thread_.joinable()) return;
  health_thread_ = std::thread([this, &board] {
    uint64_t seen = 0;
    bool first = true;
    while (!stop_) {
      gpu::HealthSnapshot snap =
          board.WaitNewer(seen, std::chrono::seconds(1), [this] { return stop_.load(); });
      if (stop_) return;
      if (first || snap.version != seen) SetHealth(snap);
      first = false;
      seen = snap.version;
    }
  });
}

void SlicePublisher::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    watch_stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (watch_thread_.joinable()) watch_thread_.join();
  if (health_thread_.joinable()) health_thread_.join();
}

}  // namespace gpulet::dra
