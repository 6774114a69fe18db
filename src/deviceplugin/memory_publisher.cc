#include "deviceplugin/memory_publisher.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>
#include <tuple>

namespace gpulet::deviceplugin {

std::string MemoryObjectName(const std::string& node_name) { return "gpulet-memory-" + node_name; }

std::string MemoryObjectPath(const std::string& namespace_name, const std::string& node_name) {
  return "/api/v1/namespaces/" + namespace_name + "/configmaps/" + MemoryObjectName(node_name);
}

nlohmann::json MemoryObjectLabels(const std::string& node_name) {
  return {{"app.kubernetes.io/name", "gpulet"},
          {"gpulet.io/memory-pool", "true"},
          {"gpulet.io/node", node_name}};
}

nlohmann::json MemoryDocument(const sharing::Resource& pool, const gpu::Inventory& inventory,
                              const gpu::HealthSnapshot* health, const UnitHolders& held,
                              const std::string& node_name, uint64_t generation,
                              std::chrono::seconds heartbeat) {
  struct PerGpu {
    std::string uuid;
    unsigned index = 0;
    std::optional<int> numa;
    int total = 0;
    int held = 0;
  };
  std::vector<PerGpu> gpus;  // plan order (GPU index)
  std::map<std::tuple<std::string, std::string, std::string, std::string>, int> pods;
  for (const sharing::AdvertisedDevice& d : pool.devices) {
    if (gpus.empty() || gpus.back().uuid != d.uuid) {
      gpus.push_back(PerGpu{d.uuid, d.gpu_index, d.numa_node, 0, 0});
    }
    ++gpus.back().total;
    auto h = held.find(d.id);
    if (h == held.end()) continue;
    ++gpus.back().held;
    if (!h->second.pod.empty()) {
      ++pods[{h->second.namespace_, h->second.pod, h->second.container, d.uuid}];
    }
  }
  nlohmann::json doc = {{"version", 1},
                        {"node", node_name},
                        {"generation", generation},
                        {"resource", pool.name},
                        {"unitBytes", pool.unit_bytes},
                        {"heartbeatSeconds", heartbeat.count()},
                        {"gpus", nlohmann::json::array()},
                        {"pods", nlohmann::json::array()}};
  for (const PerGpu& g : gpus) {
    const gpu::Gpu* info = inventory.FindByUuid(g.uuid);
    nlohmann::json j = {{"uuid", g.uuid},
                        {"index", g.index},
                        {"model", info ? info->name : ""},
                        {"healthy", health == nullptr || health->Get(g.uuid).healthy},
                        {"totalUnits", g.total},
                        {"freeUnits", std::max(0, g.total - g.held)}};
    if (g.numa) j["numaNode"] = *g.numa;
    doc["gpus"].push_back(std::move(j));
  }
  for (const auto& [key, units] : pods) {
    const auto& [ns, name, container, gpu] = key;
    doc["pods"].push_back({{"namespace", ns},
                           {"name", name},
                           {"container", container},
                           {"gpu", gpu},
                           {"units", units}});
  }
  return doc;
}

MemoryPoolPublisher::MemoryPoolPublisher(MemoryPublisherOptions options, const k8s::Client& client,
                                         Clock& clock, PodDeviceLister lister,
                                         const gpu::HealthBoard* health)
    : options_(std::move(options)),
      client_(client),
      clock_(clock),
      lister_(std::move(lister)),
      health_(health),
      absence_(options_.absence) {}

MemoryPoolPublisher::~MemoryPoolPublisher() { Stop(); }

void MemoryPoolPublisher::SetPool(const sharing::Plan& plan,
                                  std::shared_ptr<const gpu::Inventory> inventory) {
  std::lock_guard lock(mu_);
  pool_.reset();
  for (const sharing::Resource& r : plan.resources) {
    if (r.sharing == sharing::SharingKind::kMemory) {
      pool_ = r;
      break;
    }
  }
  inventory_ = std::move(inventory);
}

bool MemoryPoolPublisher::has_pool() const {
  std::lock_guard lock(mu_);
  return pool_.has_value();
}

void MemoryPoolPublisher::OnAllocate(const sharing::Resource& resource,
                                     const std::vector<std::string>& device_ids) {
  if (resource.sharing != sharing::SharingKind::kMemory) return;
  const Clock::TimePoint now = clock_.Now();
  std::lock_guard lock(mu_);
  for (const std::string& id : device_ids) {
    if (!listed_.count(id)) pending_[id] = now;
  }
}

Status MemoryPoolPublisher::Tick() {
  const Clock::TimePoint now = clock_.Now();
  const bool list_due = !listed_once_ || now >= next_list_;
  std::optional<Result<PodDeviceList>> listing;
  if (list_due && lister_) {
    listing = lister_();
    next_list_ = now + options_.list_interval;
  }
  nlohmann::json doc;
  {
    std::lock_guard lock(mu_);
    if (listing && listing->ok()) {
      std::set<std::string> ids;
      for (const auto& [id, holder] : (*listing)->devices) ids.insert(id);
      absence_.Observe(ids, (*listing)->kubelet, now);
      if (pool_) {
        for (const auto& [id, holder] : (*listing)->devices) {
          if (pool_->Find(id) != nullptr) listed_[id] = holder;
        }
      }
      // Not in this List: still held until its absence is confirmed across Lists.
      for (auto it = listed_.begin(); it != listed_.end();) {
        const bool gone = !absence_.Listed(it->first) && absence_.Gone(it->first, {});
        it =
            gone || !pool_ || pool_->Find(it->first) == nullptr ? listed_.erase(it) : std::next(it);
      }
      listed_once_ = true;
      // Listed: counted through the listing from now on. Confirmed absent from the Lists begun
      // allocate_settle after the Allocate: the container is gone (or never started).
      for (auto it = pending_.begin(); it != pending_.end();) {
        const bool settled = listed_.count(it->first) != 0 ||
                             absence_.Gone(it->first, it->second + options_.allocate_settle);
        it = settled ? pending_.erase(it) : std::next(it);
      }
    } else if (listing && !listing->ok() && !failing_) {
      spdlog::warn("event=memory_pool_list_failed action=keep_last error=\"{}\"",
                   listing->status().message());
    }
    if (!pool_ || !inventory_) return Status::Ok();
    UnitHolders held = listed_;
    for (const auto& [id, since] : pending_) held.emplace(id, PodContainer{});
    const gpu::HealthSnapshot snapshot =
        health_ != nullptr ? health_->Current() : gpu::HealthSnapshot{};
    doc = MemoryDocument(*pool_, *inventory_, health_ != nullptr ? &snapshot : nullptr, held,
                         options_.node_name, 0, options_.heartbeat);
  }
  const std::string content = doc.dump();
  const bool changed = content != last_content_;
  const bool first = publications_ == 0;
  if (!first) {
    if (now - last_publish_ < options_.min_interval) return Status::Ok();
    if (!changed && now - last_publish_ < options_.heartbeat) return Status::Ok();
  }
  Status s = Publish(doc);
  if (!s.ok()) {
    if (!failing_) {
      spdlog::warn("event=memory_pool_publish_failed action=retry error=\"{}\"", s.message());
    }
    failing_ = true;
    return s;
  }
  failing_ = false;
  last_content_ = content;
  last_publish_ = now;
  return Status::Ok();
}

Status MemoryPoolPublisher::Publish(const nlohmann::json& document) {
  const std::string path = MemoryObjectPath(options_.namespace_name, options_.node_name);
  if (!exists_known_) {
    k8s::ApiResult<nlohmann::json> current = client_.Get(path);
    if (current.ok()) {
      exists_ = true;
      try {
        const nlohmann::json old =
            nlohmann::json::parse(current->at("data").at("memory.json").get<std::string>());
        std::lock_guard lock(mu_);
        generation_ = std::max(generation_, old.at("generation").get<uint64_t>());
      } catch (const std::exception&) {
        // Not ours to read: overwritten below.
      }
    } else if (current.status().code() == ErrorCode::kNotFound) {
      exists_ = false;
    } else {
      return current.status();
    }
    std::lock_guard lock(mu_);
    generation_ = std::max(generation_, static_cast<uint64_t>(clock_.WallMillis()));
    exists_known_ = true;
  }
  nlohmann::json doc = document;
  doc["generation"] = generation_ + 1;
  const nlohmann::json data = {{"memory.json", doc.dump()}};
  const nlohmann::json labels = MemoryObjectLabels(options_.node_name);
  auto create = [&]() -> k8s::ApiResult<nlohmann::json> {
    return client_.Post("/api/v1/namespaces/" + options_.namespace_name + "/configmaps",
                        {{"apiVersion", "v1"},
                         {"kind", "ConfigMap"},
                         {"metadata",
                          {{"name", MemoryObjectName(options_.node_name)},
                           {"namespace", options_.namespace_name},
                           {"labels", labels}}},
                         {"data", data}});
  };
  auto patch = [&]() -> k8s::ApiResult<nlohmann::json> {
    return client_.Patch(path, {{"metadata", {{"labels", labels}}}, {"data", data}},
                         k8s::PatchType::kMerge);
  };
  k8s::ApiResult<nlohmann::json> r = exists_ ? patch() : create();
  if (!r.ok() && exists_ && r.http_status() == 404) r = create();  // deleted meanwhile
  if (!r.ok() && !exists_ && r.http_status() == 409) r = patch();  // created meanwhile
  if (!r.ok()) {
    exists_known_ = false;  // read it again before the retry
    return r.status();
  }
  exists_ = true;
  {
    std::lock_guard lock(mu_);
    ++generation_;
    ++publications_;
  }
  published_cv_.notify_all();
  if (options_.on_publish) options_.on_publish(doc);
  spdlog::debug("event=memory_pool_published generation={} path={}", generation_, path);
  return Status::Ok();
}

void MemoryPoolPublisher::Start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] {
    do {
      Status s = Tick();
      (void)s;  // logged by Tick; retried on the next cycle
    } while (clock_.SleepFor(options_.min_interval, stop_));
  });
}

void MemoryPoolPublisher::Stop() {
  stop_.Stop();
  if (thread_.joinable()) thread_.join();
}

uint64_t MemoryPoolPublisher::generation() const {
  std::lock_guard lock(mu_);
  return generation_;
}

size_t MemoryPoolPublisher::publications() const {
  std::lock_guard lock(mu_);
  return publications_;
}

bool MemoryPoolPublisher::WaitForPublications(size_t n, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mu_);
  return published_cv_.wait_for(lock, timeout, [&] { return publications_ >= n; });
}

}  // namespace gpulet::deviceplugin
