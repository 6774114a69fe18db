#include "broker/lease.h"

#include <spdlog/spdlog.h>

#include "broker/k8s_side.h"

namespace gpulet::broker {

using nlohmann::json;

LeaseElector::LeaseElector(const k8s::Client& client, const BrokerConfig& config,
                           std::string identity, Clock& clock)
    : client_(client),
      config_(config),
      identity_(std::move(identity)),
      clock_(clock),
      observed_at_(clock.Now()),
      held_until_(clock.Now()) {}

bool LeaseElector::HeldFor(Clock::Duration margin) const {
  return clock_.Now() + margin < held_until_;
}

Result<bool> LeaseElector::TryAcquireOrRenew() {
  const std::string base =
      "/apis/coordination.k8s.io/v1/namespaces/" + config_.lease_namespace + "/leases";
  const std::string path = base + "/" + config_.lease_name;
  const int duration_s = static_cast<int>((config_.lease_duration + 999) / 1000);
  // Our lease runs from the moment the request leaves, not from when the answer arrives.
  const Clock::TimePoint sent = clock_.Now();
  const std::string wall = FormatMicroTime(clock_.WallMillis());
  json spec = {
      {"holderIdentity", identity_}, {"leaseDurationSeconds", duration_s}, {"renewTime", wall}};

  k8s::ApiResult<json> lease = client_.Get(path);
  if (!lease.ok()) {
    if (lease.http_status() != 404) return lease.status();
    spec["acquireTime"] = wall;
    spec["leaseTransitions"] = 0;
    json obj = {
        {"apiVersion", "coordination.k8s.io/v1"},
        {"kind", "Lease"},
        {"metadata", {{"name", config_.lease_name}, {"namespace", config_.lease_namespace}}},
        {"spec", spec}};
    k8s::ApiResult<json> created = client_.Post(base, obj);
    if (!created.ok()) {
      if (created.http_status() == 409) return false;  // another was faster
      return created.status();
    }
    held_until_ = sent + std::chrono::milliseconds(config_.lease_duration);
    holding_ = true;
    ++terms_;
    spdlog::info("event=broker_lease_acquired identity={} lease={}/{} term={} how=created",
                 identity_, config_.lease_namespace, config_.lease_name, terms_);
    return true;
  }

  const json s = (*lease).value("spec", json::object());
  const std::string holder = s.value("holderIdentity", "");
  const std::string version = (*lease)["metadata"].value("resourceVersion", "");
  const std::string record = version + "|" + holder + "|" + s.value("renewTime", "");
  if (record != observed_record_) {
    observed_record_ = record;
    observed_at_ = sent;
  }
  const bool ours = holder == identity_;
  if (!ours) held_until_ = sent;  // someone else wrote it: whatever we held is gone
  // A term starts when we take the lease from someone else, or find it ours without having known
  // (our create or takeover landed but its answer was lost): another replica may have acted
  // before, so the caller must read shared state again either way.
  const bool new_term = !ours || !holding_;
  if (!ours) holding_ = false;
  if (!ours && !holder.empty()) {
    const int64_t held_s = s.value("leaseDurationSeconds", duration_s);
    if (sent < observed_at_ + std::chrono::seconds(held_s)) return false;
  }
  if (!ours) {
    spec["acquireTime"] = wall;
    spec["leaseTransitions"] = s.value("leaseTransitions", 0) + (holder.empty() ? 0 : 1);
  }
  json patch = {{"metadata", {{"resourceVersion", version}}}, {"spec", spec}};
  k8s::ApiResult<json> r = client_.Patch(path, patch, k8s::PatchType::kMerge);
  if (!r.ok()) {
    if (r.http_status() == 409) return false;  // another replica wrote first
    return r.status();
  }
  held_until_ = sent + std::chrono::milliseconds(config_.lease_duration);
  if (new_term) {
    ++terms_;
    spdlog::info("event=broker_lease_acquired identity={} lease={}/{} term={} previous={}",
                 identity_, config_.lease_namespace, config_.lease_name, terms_,
                 holder.empty() ? "-" : holder);
  }
  holding_ = true;
  return true;
}

}  // namespace gpulet::broker
