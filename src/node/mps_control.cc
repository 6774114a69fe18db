#include "node/mps_control.h"

#include <spdlog/spdlog.h>

#include <map>

#include "deviceplugin/resource_server.h"
#include "mps/supervisor.h"

namespace gpulet::node {

MpsControl::MpsControl(std::string control_binary, std::shared_ptr<gpu::Nvml> nvml,
                       gpu::HealthBoard& board)
    : control_binary_(std::move(control_binary)), nvml_(std::move(nvml)), board_(board) {}

MpsControl::~MpsControl() { Stop(); }

Status MpsControl::Apply(const sharing::Plan& plan, const gpu::Inventory& inventory,
                         const std::string& root) {
  std::vector<mps::DaemonSpec> specs;
  std::string key = root;
  for (const sharing::Resource& r : plan.resources) {
    if (r.sharing != sharing::SharingKind::kMps) continue;
    mps::DaemonSpec spec;
    spec.resource_name = r.name;
    spec.replicas = r.replicas;
    key += "|" + r.name + "/" + std::to_string(r.replicas);
    for (const sharing::AdvertisedDevice& d : r.devices) {
      if (!spec.gpu_uuids.empty() && spec.gpu_uuids.back() == d.uuid) continue;
      const gpu::Gpu* g = inventory.FindByUuid(d.uuid);
      spec.gpu_uuids.push_back(d.uuid);
      spec.gpu_indices.push_back(d.gpu_index);
      spec.memory_bytes.push_back(g ? g->memory_mib * 1024 * 1024 : 0);
      key += "," + d.uuid;
    }
    specs.push_back(std::move(spec));
  }
  if (key == key_ && (supervisor_ || specs.empty())) return Status::Ok();
  if (supervisor_ && !specs.empty() && root == root_) {
    // Same root: restart only the daemons whose resource changed; the rest keep serving.
    Status s = supervisor_->Update(specs);
    key_ = key;
    std::map<std::string, gpu::DeviceHealth> state;
    resources_.clear();
    for (const mps::DaemonSpec& spec : specs) {
      resources_.push_back(spec.resource_name);
      if (!s.ok()) continue;  // the failed one is reported by the supervisor's listener
      state[deviceplugin::MpsHealthKey(spec.resource_name)] =
          supervisor_->Healthy(spec.resource_name) ? gpu::DeviceHealth{}
                                                   : gpu::DeviceHealth{false, "MPS daemon down"};
    }
    board_.Update(state);
    spdlog::info("event=mps_updated resources={} root={}", specs.size(), root);
    return s;
  }
  Stop();
  key_ = key;
  root_ = root;
  if (specs.empty()) return Status::Ok();
  mps::SupervisorOptions o;
  o.control_binary = control_binary_;
  o.root = root;
  auto sup = std::make_unique<mps::Supervisor>(o, nvml_);
  gpu::HealthBoard& board = board_;
  Status s = sup->Start(specs, [&board](const std::string& resource, bool healthy) {
    spdlog::log(healthy ? spdlog::level::info : spdlog::level::warn,
                "event=mps_daemon_health resource={} healthy={}", resource, healthy);
    board.Update({{deviceplugin::MpsHealthKey(resource),
                   healthy ? gpu::DeviceHealth{} : gpu::DeviceHealth{false, "MPS daemon down"}}});
  });
  std::map<std::string, gpu::DeviceHealth> state;
  for (const mps::DaemonSpec& spec : specs) {
    state[deviceplugin::MpsHealthKey(spec.resource_name)] =
        s.ok() ? gpu::DeviceHealth{}
               : gpu::DeviceHealth{false, "MPS daemon failed to start: " + s.message()};
    resources_.push_back(spec.resource_name);
  }
  board_.Update(state);
  if (!s.ok()) return s;
  supervisor_ = std::move(sup);
  spdlog::info("event=mps_started resources={} root={}", specs.size(), root);
  return Status::Ok();
}

void MpsControl::Stop() {
  if (!supervisor_) return;
  supervisor_->Stop();
  supervisor_.reset();
  spdlog::info("event=mps_stopped resources={}", resources_.size());
  resources_.clear();
}

void MpsControl::Detach() {
  if (!supervisor_) return;
  supervisor_->Detach();
  supervisor_.reset();
  spdlog::info("event=mps_detached resources={} note=\"daemons left running for the next gpulet\"",
               resources_.size());
  resources_.clear();
}

}  // namespace gpulet::node
