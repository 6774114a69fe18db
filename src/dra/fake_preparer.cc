// The plugin tests' Preparer (fake_preparer.h).
#include "dra/fake_preparer.h"

#include <nlohmann/json.hpp>

#include "dra/names.h"

namespace gpulet::dra {
namespace {

std::string Key(const std::string& uid, const AllocatedDevice& d) {
  return uid + "/" + d.device + (d.share_id.empty() ? "" : "/" + d.share_id);
}

}  // namespace

Result<PrepareResult> FakePreparer::Prepare(const Claim& claim) {
  std::lock_guard<std::mutex> lk(mu_);
  calls_.push_back({"prepare", claim.ref.uid, ""});
  const bool fail = fail_prepare_times_ > 0;
  if (fail) --fail_prepare_times_;
  PrepareResult out;
  nlohmann::json keys = nlohmann::json::array();
  std::vector<std::string> done;
  auto roll_back = [&] {
    for (const std::string& k : done) live_.erase(k);  // all-or-nothing
    return Status(ErrorCode::kInternal, "fake preparer: " + fail_prepare_message_);
  };
  for (size_t i = 0; i < claim.devices.size(); ++i) {
    const AllocatedDevice& d = claim.devices[i];
    if (fail && i == fail_after_) return roll_back();
    const std::string key = Key(claim.ref.uid, d);
    if (live_.insert(key).second) done.push_back(key);
    keys.push_back(key);
    PreparedDevice p;
    p.requests = {d.request.substr(0, d.request.find('/'))};
    p.pool = d.pool;
    p.device = d.device;
    p.share_id = d.share_id;
    p.cdi_device_ids = {std::string(kDriverName) + "/gpu=" + claim.ref.uid + "-" + d.device};
    p.status_data = nlohmann::json{{"fakeKey", key}}.dump();
    out.devices.push_back(std::move(p));
  }
  if (fail) return roll_back();  // failing after the last device: still all-or-nothing
  out.record_json = nlohmann::json{{"v", 1}, {"keys", keys}}.dump();
  return out;
}

Status FakePreparer::Unprepare(const ClaimRef& claim, const std::string& record_json) {
  std::lock_guard<std::mutex> lk(mu_);
  calls_.push_back({"unprepare", claim.uid, record_json});
  if (fail_unprepare_times_ > 0) {
    --fail_unprepare_times_;
    return Status(ErrorCode::kInternal, "fake preparer: " + fail_unprepare_message_);
  }
  if (record_json.empty()) {  // an interrupted Prepare: undo whatever this UID holds
    for (auto it = live_.begin(); it != live_.end();) {
      it = it->rfind(claim.uid + "/", 0) == 0 ? live_.erase(it) : std::next(it);
    }
    return Status::Ok();
  }
  nlohmann::json rec = nlohmann::json::parse(record_json, nullptr, false);
  if (rec.is_discarded() || !rec.contains("keys") || !rec["keys"].is_array()) {
    return Status(ErrorCode::kInvalidInput, "fake preparer: bad record " + record_json);
  }
  for (const nlohmann::json& k : rec["keys"]) {
    if (k.is_string()) live_.erase(k.get<std::string>());
  }
  return Status::Ok();
}

void FakePreparer::FailPrepare(size_t after_devices, std::string message, int times) {
  std::lock_guard<std::mutex> lk(mu_);
  fail_after_ = after_devices;
  fail_prepare_message_ = std::move(message);
  fail_prepare_times_ = times;
}

void FakePreparer::FailUnprepare(std::string message, int times) {
  std::lock_guard<std::mutex> lk(mu_);
  fail_unprepare_message_ = std::move(message);
  fail_unprepare_times_ = times;
}

std::vector<FakePreparer::Call> FakePreparer::calls() const {
  std::lock_guard<std::mutex> lk(mu_);
  return calls_;
}

size_t FakePreparer::prepare_calls() const {
  std::lock_guard<std::mutex> lk(mu_);
  size_t n = 0;
  for (const Call& c : calls_) n += c.op == "prepare";
  return n;
}

std::set<std::string> FakePreparer::live() const {
  std::lock_guard<std::mutex> lk(mu_);
  return live_;
}

}  // namespace gpulet::dra
