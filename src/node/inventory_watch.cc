#include "node/inventory_watch.h"

#include <spdlog/spdlog.h>

#include <optional>

#include "mig/layout_lock.h"
#include "sharing/plan.h"

namespace gpulet::node {

const char* RescanOutcomeName(RescanOutcome outcome) {
  switch (outcome) {
    case RescanOutcome::kUnchanged:
      return "unchanged";
    case RescanOutcome::kChanged:
      return "changed";
    case RescanOutcome::kDeferred:
      return "deferred";
    case RescanOutcome::kFailed:
      return "failed";
  }
  return "unknown";
}

InventoryWatch::InventoryWatch(std::shared_ptr<const gpu::Inventory> initial, DiscoverFn discover,
                               std::string lock_path)
    : discover_(std::move(discover)),
      lock_path_(std::move(lock_path)),
      inventory_(std::move(initial)) {}

std::shared_ptr<const gpu::Inventory> InventoryWatch::Current(uint64_t* generation) const {
  std::lock_guard<std::mutex> l(mu_);
  if (generation) *generation = generation_;
  return inventory_;
}

RescanOutcome InventoryWatch::Rescan() {
  std::lock_guard<std::mutex> one(rescan_mu_);
  std::optional<mig::LayoutLock> lock;
  if (!lock_path_.empty()) {
    lock = mig::LayoutLock::TryShared(lock_path_);
    if (!lock) {
      // Once per apply at info; every retry at debug.
      spdlog::log(deferred_ ? spdlog::level::debug : spdlog::level::info,
                  "event=rescan_deferred reason=mig_apply_in_progress lock={}", lock_path_);
      deferred_ = true;
      return RescanOutcome::kDeferred;
    }
    if (deferred_) spdlog::info("event=rescan_resumed reason=mig_apply_done lock={}", lock_path_);
    deferred_ = false;
  }
  Result<gpu::Inventory> found = discover_();
  if (!found.ok()) {
    spdlog::warn("event=rescan_failed action=keep_current error=\"{}\"", found.status().message());
    return RescanOutcome::kFailed;
  }
  std::lock_guard<std::mutex> l(mu_);
  if (sharing::SameDevices(*inventory_, *found)) return RescanOutcome::kUnchanged;
  inventory_ = std::make_shared<const gpu::Inventory>(std::move(found).value());
  ++generation_;
  spdlog::info("event=inventory_changed gpus={} mig_devices={} generation={}",
               inventory_->gpus.size(), inventory_->MigDeviceCount(), generation_);
  return RescanOutcome::kChanged;
}

}  // namespace gpulet::node
