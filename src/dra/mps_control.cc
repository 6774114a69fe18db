#include "dra/mps_control.h"

#include <algorithm>
#include <vector>

#include "dra/names.h"

namespace gpulet::dra {

SupervisorMpsControl::SupervisorMpsControl(mps::SupervisorOptions options,
                                           std::shared_ptr<gpu::Nvml> nvml)
    : root_(options.root),
      supervisor_(std::make_unique<mps::Supervisor>(std::move(options), std::move(nvml))) {}

SupervisorMpsControl::~SupervisorMpsControl() { supervisor_->Stop(); }

Result<std::shared_ptr<SupervisorMpsControl>> SupervisorMpsControl::Create(
    mps::SupervisorOptions options, std::shared_ptr<gpu::Nvml> nvml) {
  std::shared_ptr<SupervisorMpsControl> c(
      new SupervisorMpsControl(std::move(options), std::move(nvml)));
  if (Status s = c->supervisor_->Start({}, nullptr); !s.ok()) return s;
  return c;
}

std::string SupervisorMpsControl::ResourceName(const std::string& claim_uid) {
  return std::string(kDriverName) + "/claim-" + claim_uid;
}

std::vector<mps::DaemonSpec> SupervisorMpsControl::Specs() const {
  std::vector<mps::DaemonSpec> out;
  for (const auto& [uid, spec] : specs_) out.push_back(spec);
  return out;
}

Result<MpsDaemonDirs> SupervisorMpsControl::Start(const MpsRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  mps::DaemonSpec spec;
  spec.resource_name = ResourceName(request.claim_uid);
  spec.gpu_uuids = request.gpu_uuids;
  spec.gpu_indices = request.gpu_indices;
  spec.replicas =
      request.active_thread_percentage > 0 ? std::max(1, 100 / request.active_thread_percentage) : 1;
  for (uint64_t memory : request.memory_bytes) {
    const uint64_t per = request.pinned_memory_bytes > 0 ? request.pinned_memory_bytes : memory;
    spec.memory_bytes.push_back(per * static_cast<uint64_t>(spec.replicas));
  }
  const auto previous = specs_.find(request.claim_uid);
  const bool known = previous != specs_.end();
  const mps::DaemonSpec before = known ? previous->second : mps::DaemonSpec{};
  specs_[request.claim_uid] = spec;
  if (Status s = supervisor_->Update(Specs()); !s.ok()) {
    if (known) {
      specs_[request.claim_uid] = before;
    } else {
      specs_.erase(request.claim_uid);
    }
    (void)supervisor_->Update(Specs());
    return s;
  }
  std::vector<std::string> commands;
  if (request.active_thread_percentage > 0) {
    commands.push_back("set_default_active_thread_percentage " +
                       std::to_string(request.active_thread_percentage));
  }
  if (request.pinned_memory_bytes > 0) {
    for (size_t i = 0; i < request.gpu_uuids.size(); ++i) {
      commands.push_back("set_default_device_pinned_mem_limit " + std::to_string(i) + " " +
                         std::to_string(request.pinned_memory_bytes >> 20) + "M");
    }
  }
  if (!commands.empty()) {
    Result<mps::ControlOutput> out = supervisor_->Control(spec.resource_name, commands);
    Status failed = !out.ok() ? out.status()
                    : out->exit_code != 0
                        ? Status(ErrorCode::kUnavailable,
                                 spec.resource_name + ": setting the defaults: " + out->out)
                        : Status::Ok();
    if (!failed.ok()) {
      specs_.erase(request.claim_uid);
      (void)supervisor_->Update(Specs());
      return failed;
    }
  }
  const mps::DaemonPaths paths = mps::PathsFor(root_, spec.resource_name);
  return MpsDaemonDirs{paths.pipe_dir, paths.shm_dir};
}

Status SupervisorMpsControl::Stop(const std::string& claim_uid) {
  std::lock_guard<std::mutex> lock(mu_);
  if (specs_.erase(claim_uid) == 0) return Status::Ok();
  return supervisor_->Update(Specs());
}

}  // namespace gpulet::dra
