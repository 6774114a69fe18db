// The health stream's contents from the NVML health board (health_stream.h).
#include "dra/health_stream.h"

#include <map>

#include "dra/names.h"

namespace gpulet::dra {

std::vector<DeviceHealthReport> HealthReports(const gpu::Inventory& inventory,
                                              const gpu::HealthSnapshot& health) {
  std::vector<DeviceHealthReport> out;
  for (const gpu::Gpu& g : inventory.gpus) {
    gpu::DeviceHealth h = health.Get(g.uuid);
    for (const gpu::MigDevice& m : g.mig_devices) {
      const gpu::DeviceHealth& mh = health.Get(m.uuid);
      if (h.healthy && !mh.healthy) h = gpu::DeviceHealth{false, m.uuid + ": " + mh.reason};
    }
    for (DeviceKind kind : {DeviceKind::kGpu, DeviceKind::kMemoryShare}) {
      DeviceName name;
      name.kind = kind;
      name.gpu_index = g.index;
      DeviceHealthReport r;
      r.device = FormatDeviceName(name);
      r.health = h.healthy ? DeviceHealthReport::Health::kHealthy
                           : DeviceHealthReport::Health::kUnhealthy;
      r.message = h.reason;
      out.push_back(std::move(r));
    }
  }
  return out;
}

HealthFeeder::HealthFeeder(DraPlugin& plugin, const gpu::HealthBoard& board,
                           std::shared_ptr<const gpu::Inventory> inventory)
    : plugin_(plugin), board_(board), inventory_(std::move(inventory)) {}

HealthFeeder::~HealthFeeder() { Stop(); }

void HealthFeeder::Start() {
  stop_ = false;
  thread_ = std::thread([this] {
    gpu::HealthSnapshot snap = board_.Current();
    while (!stop_) {
      plugin_.SetDeviceHealth(HealthReports(*inventory_, snap));
      const uint64_t seen = snap.version;
      do {
        snap = board_.WaitNewer(seen, std::chrono::seconds(5), [this] { return stop_.load(); });
      } while (!stop_ && snap.version == seen);
    }
  });
}

void HealthFeeder::Stop() {
  stop_ = true;
  board_.Wake();
  if (thread_.joinable()) thread_.join();
}

}  // namespace gpulet::dra
