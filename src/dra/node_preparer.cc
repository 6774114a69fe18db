#include "dra/node_preparer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/files.h"
#include "common/tenant_file.h"
#include "cudashim/limits_dir.h"
#include "dra/cdi.h"
#include "dra/names.h"
#include "dra/opaque_config.h"
#include "mig/driver.h"
#include "mig/layout_lock.h"

namespace gpulet::dra {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr int kRecordVersion = 1;
constexpr size_t kMaxRecordBytes = 1u << 20;
constexpr char kClaimsDir[] = "claims";
constexpr char kLimitsDir[] = "limits";
// Where an MPS daemon's pipe directory appears in the container.
constexpr char kMpsContainerPipeDir[] = "/run/gpulet/mps/pipe";

// A Kubernetes UID (a UUID) is used in file and device names: lowercase hex digits and '-' only.
bool ValidUid(const std::string& uid) {
  if (uid.empty() || uid.size() > 64) return false;
  return std::all_of(uid.begin(), uid.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || c == '-';
  });
}

// One MIG device this claim made.
struct MigRecord {
  unsigned gpu = 0;
  std::string gpu_uuid;
  std::string profile;  // the GPU instance profile, "1g.10gb"
  unsigned start = 0;
  std::optional<unsigned> gi;  // unset while only intended (a crash between journal and create)
  bool enabled_mig = false;    // this claim turned MIG mode on
  std::string mig_uuid;
  std::string gi_cap_path, ci_cap_path;  // not recorded: read when created
};

struct DeviceRecord {
  PreparedDevice prepared;
  std::string uuid;  // the GPU's
  std::string mig_uuid;
  uint64_t memory_limit = 0;
  std::string sharing;  // "TimeSlicing" | "MPS" | ""
};

struct Record {
  ClaimRef claim;
  bool complete = false;   // false: a journal written before MIG creates, or a failed prepare
  std::string spec_file;   // "" when no spec was needed
  bool limits_dir = false;  // <state_dir>/limits/<uid>/ exists
  bool mps = false;
  std::vector<MigRecord> mig;
  std::vector<DeviceRecord> devices;
};

json MigToJson(const MigRecord& m) {
  json j = {{"gpu", m.gpu},           {"gpuUuid", m.gpu_uuid},        {"profile", m.profile},
            {"start", m.start},       {"enabledMig", m.enabled_mig},  {"migUuid", m.mig_uuid}};
  if (m.gi) j["gi"] = *m.gi;
  return j;
}

std::string RecordToJson(const Record& r) {
  json j = {{"version", kRecordVersion},
            {"claim", {{"namespace", r.claim.namespace_}, {"name", r.claim.name}, {"uid", r.claim.uid}}},
            {"complete", r.complete},
            {"specFile", r.spec_file},
            {"limitsDir", r.limits_dir},
            {"mps", r.mps}};
  j["mig"] = json::array();
  for (const MigRecord& m : r.mig) j["mig"].push_back(MigToJson(m));
  j["devices"] = json::array();
  for (const DeviceRecord& d : r.devices) {
    json o = {{"requests", d.prepared.requests}, {"pool", d.prepared.pool},
              {"device", d.prepared.device},     {"shareId", d.prepared.share_id},
              {"cdiDeviceIds", d.prepared.cdi_device_ids}, {"uuid", d.uuid}};
    if (!d.mig_uuid.empty()) o["migUuid"] = d.mig_uuid;
    if (d.memory_limit != 0) o["memoryLimit"] = d.memory_limit;
    if (!d.sharing.empty()) o["sharing"] = d.sharing;
    j["devices"].push_back(std::move(o));
  }
  return j.dump();
}

// Parses a record; errors (kInvalidInput) name `source` and what is wrong. Every field is checked
// for its type: a record is the agent's own, but a checkpoint file may be damaged.
Result<Record> RecordFromJson(const std::string& text, const std::string& source) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& what) {
    return Status(ErrorCode::kInvalidInput, source + ": " + what);
  };
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  if (!j.contains("version") || j["version"] != kRecordVersion) {
    return bad("version: want " + std::to_string(kRecordVersion));
  }
  try {
    Record r;
    const json& c = j.at("claim");
    r.claim.namespace_ = c.at("namespace").get<std::string>();
    r.claim.name = c.at("name").get<std::string>();
    r.claim.uid = c.at("uid").get<std::string>();
    r.complete = j.at("complete").get<bool>();
    r.spec_file = j.at("specFile").get<std::string>();
    r.limits_dir = j.at("limitsDir").get<bool>();
    r.mps = j.at("mps").get<bool>();
    for (const json& m : j.at("mig")) {
      MigRecord x;
      x.gpu = m.at("gpu").get<unsigned>();
      x.gpu_uuid = m.at("gpuUuid").get<std::string>();
      x.profile = m.at("profile").get<std::string>();
      x.start = m.at("start").get<unsigned>();
      if (m.contains("gi")) x.gi = m.at("gi").get<unsigned>();
      x.enabled_mig = m.at("enabledMig").get<bool>();
      x.mig_uuid = m.at("migUuid").get<std::string>();
      r.mig.push_back(std::move(x));
    }
    for (const json& d : j.at("devices")) {
      DeviceRecord x;
      x.prepared.requests = d.at("requests").get<std::vector<std::string>>();
      x.prepared.pool = d.at("pool").get<std::string>();
      x.prepared.device = d.at("device").get<std::string>();
      x.prepared.share_id = d.at("shareId").get<std::string>();
      x.prepared.cdi_device_ids = d.at("cdiDeviceIds").get<std::vector<std::string>>();
      x.uuid = d.at("uuid").get<std::string>();
      if (d.contains("migUuid")) x.mig_uuid = d.at("migUuid").get<std::string>();
      if (d.contains("memoryLimit")) x.memory_limit = d.at("memoryLimit").get<uint64_t>();
      if (d.contains("sharing")) x.sharing = d.at("sharing").get<std::string>();
      r.devices.push_back(std::move(x));
    }
    if (!ValidUid(r.claim.uid)) return bad("claim.uid: not a UID");
    return r;
  } catch (const json::exception& e) {
    return bad(std::string("malformed: ") + e.what());
  }
}

// status.devices[].data for one device (PreparedDevice::status_data): {"uuid": GPU UUID,
// "migUuid": …, "memoryLimit": bytes, "sharing": "TimeSlicing"|"MPS"}, only the keys that apply.
std::string StatusDataOf(const DeviceRecord& d) {
  json data = {{"uuid", d.uuid}};
  if (!d.mig_uuid.empty()) data["migUuid"] = d.mig_uuid;
  if (d.memory_limit != 0) data["memoryLimit"] = d.memory_limit;
  if (!d.sharing.empty()) data["sharing"] = d.sharing;
  return data.dump();
}

PrepareResult ResultOf(const Record& r) {
  PrepareResult out;
  for (const DeviceRecord& d : r.devices) {
    out.devices.push_back(d.prepared);
    out.devices.back().status_data = StatusDataOf(d);
  }
  out.record_json = RecordToJson(r);
  return out;
}

// What Prepare decided for one allocated device before doing anything.
struct DevicePlan {
  const AllocatedDevice* allocated = nullptr;
  DeviceName name;
  const gpu::Gpu* gpu = nullptr;
  std::optional<DeviceConfig> config;
  std::string mig_profile;  // kMig: the GPU instance profile name ("1g.10gb")
  size_t mig_index = 0;     // kMig: index into Record::mig
};

std::string RequestBase(const std::string& request) { return request.substr(0, request.find('/')); }

class NodePreparer final : public Preparer {
 public:
  explicit NodePreparer(NodePreparerOptions o) : o_(std::move(o)) {
    if (o_.host_driver_root.empty()) o_.host_driver_root = o_.driver_root;
    if (o_.mig_lock_file.empty()) o_.mig_lock_file = mig::LayoutLockPath("");
  }

  Result<PrepareResult> Prepare(const Claim& claim) override;
  Status Unprepare(const ClaimRef& claim, const std::string& record_json) override;

 private:
  std::string Who(const ClaimRef& c) const {
    return "ResourceClaim " + c.namespace_ + "/" + c.name + " (" + c.uid + ")";
  }
  std::string RecordPath(const std::string& uid) const {
    return o_.state_dir + "/" + kClaimsDir + "/" + uid + ".json";
  }
  std::string LimitsRoot() const { return o_.state_dir + "/" + kLimitsDir; }
  std::string SpecPath(const std::string& uid) const {
    return o_.cdi_root + "/" + TransientSpecName(uid) + ".json";
  }

  Status WriteRecord(const Record& r) const {
    std::error_code ec;
    fs::create_directories(o_.state_dir + "/" + kClaimsDir, ec);
    if (ec) return Status(ErrorCode::kInternal, o_.state_dir + "/" + kClaimsDir + ": " + ec.message());
    return WriteFileAtomic(RecordPath(r.claim.uid), RecordToJson(r), 0600);
  }

  Result<const DriverFiles*> Driver() {
    if (!driver_) {
      Result<DriverFiles> f = FindDriverFiles(o_.driver_root, o_.inventory.driver_version);
      if (!f.ok()) return f.status();
      driver_ = std::move(f).value();
    }
    return &*driver_;
  }

  Status CreateMig(MigRecord& m, const std::string& slug);
  Status DestroyMig(const MigRecord& m);
  Status Undo(const Record& r, bool remove_record);

  NodePreparerOptions o_;
  std::mutex mu_;
  std::optional<DriverFiles> driver_;
};

Status NodePreparer::CreateMig(MigRecord& m, const std::string& slug) {
  const std::string who = "GPU " + std::to_string(m.gpu);
  Result<std::vector<mig::GpuState>> state = mig::ReadMigState(*o_.nvml);
  if (!state.ok()) return state.status();
  if (m.gpu >= state->size()) return Status(ErrorCode::kNotFound, who + ": not on this node");
  const mig::GpuState& g = (*state)[m.gpu];
  if (!g.mig_capable) return Status(ErrorCode::kInvalidInput, who + " (" + g.name + "): no MIG");
  const mig::ProfileSpec* profile = nullptr;
  for (const mig::ProfileSpec& p : g.profiles) {
    if (ProfileSlug(p.name) == slug) profile = &p;
  }
  if (profile == nullptr) {
    return Status(ErrorCode::kInvalidInput,
                  who + " (" + g.name + "): no MIG profile named like \"" + slug + "\"");
  }
  if (std::find(profile->starts.begin(), profile->starts.end(), m.start) == profile->starts.end()) {
    return Status(ErrorCode::kInvalidInput, who + ": " + profile->name +
                                                " cannot start at memory slice " +
                                                std::to_string(m.start));
  }
  // `state` is read again below: keep nothing that points into it.
  const std::string profile_name = profile->name;
  m.profile = profile_name;
  m.gpu_uuid = g.uuid;
  mig::Plan plan;
  plan.config = "dra";
  mig::GpuPlan gp;
  gp.index = g.index;
  gp.name = g.name;
  gp.mig_before = g.mig_enabled;
  gp.mig_after = true;
  gp.keep = g.instances;
  gp.create.push_back({profile_name, m.start, std::nullopt, true});
  plan.gpus.push_back(gp);
  m.enabled_mig = !g.mig_enabled;
  if (Status s = mig::ApplyPlan(*o_.nvml, plan); !s.ok()) {
    m.enabled_mig = false;  // ApplyPlan rolled the GPU back, mode included
    return s;
  }
  state = mig::ReadMigState(*o_.nvml);
  if (!state.ok()) return state.status();
  for (const mig::GpuInstance& i : (*state)[m.gpu].instances) {
    if (i.start == m.start && i.profile == profile_name) m.gi = i.gi;
  }
  if (!m.gi) return Status(ErrorCode::kNvmlError, who + ": created " + profile_name + " is gone");
  Result<gpu::Inventory> inv = gpu::Discover(*o_.nvml, o_.discover);
  if (!inv.ok()) return inv.status();
  for (const gpu::Gpu& gg : inv->gpus) {
    if (gg.index != m.gpu) continue;
    for (const gpu::MigDevice& d : gg.mig_devices) {
      if (d.gpu_instance_id != *m.gi) continue;
      m.mig_uuid = d.uuid;
      m.gi_cap_path = d.gi_cap_path;
      m.ci_cap_path = d.ci_cap_path;
    }
  }
  if (m.mig_uuid.empty()) {
    return Status(ErrorCode::kNvmlError,
                  who + ": created " + profile_name + " (GI " + std::to_string(*m.gi) +
                      ") has no MIG device in the inventory");
  }
  return Status::Ok();
}

Status NodePreparer::DestroyMig(const MigRecord& m) {
  Result<std::vector<mig::GpuState>> state = mig::ReadMigState(*o_.nvml);
  if (!state.ok()) return state.status();
  if (m.gpu >= state->size()) return Status::Ok();  // the GPU is gone: nothing of ours is left
  const mig::GpuState& g = (*state)[m.gpu];
  if (!m.gpu_uuid.empty() && g.uuid != m.gpu_uuid) return Status::Ok();  // another GPU now
  mig::GpuPlan gp;
  gp.index = g.index;
  gp.name = g.name;
  gp.mig_before = g.mig_enabled;
  for (const mig::GpuInstance& i : g.instances) {
    // Ours: the profile at the start, and (once known) the GPU instance id.
    // (A journal written before the create holds the name's slug: compare slugs.)
    const bool ours = ProfileSlug(i.profile) == ProfileSlug(m.profile) && i.start == m.start &&
                      (!m.gi || i.gi == m.gi);
    (ours ? gp.destroy : gp.keep).push_back(i);
  }
  // MIG mode goes back off only when this claim turned it on and nothing else is left on it.
  gp.mig_after = g.mig_enabled && !(m.enabled_mig && gp.keep.empty());
  if (!gp.changes()) return Status::Ok();
  mig::Plan plan;
  plan.config = "dra";
  plan.gpus.push_back(gp);
  return mig::ApplyPlan(*o_.nvml, plan);
}

// Undoes what `r` says was made, newest first; keeps going past a failure and returns the first.
Status NodePreparer::Undo(const Record& r, bool remove_record) {
  Status first;
  auto note = [&](Status s) {
    if (!s.ok() && first.ok()) first = std::move(s);
  };
  const std::string uid = r.claim.uid;
  // The spec first: a container started from here on gets nothing of this claim. (A cdi_root
  // that is not a directory holds no spec.)
  if (std::error_code ec; fs::remove(SpecPath(uid), ec), ec && ec != std::errc::not_a_directory) {
    note(Status(ErrorCode::kInternal, SpecPath(uid) + ": remove: " + ec.message()));
  }
  if (r.mps && o_.mps) note(o_.mps->Stop(uid));
  {
    std::error_code ec;
    if (fs::exists(LimitsRoot(), ec)) {
      Result<TenantDir> root = TenantDir::Open(LimitsRoot());
      if (!root.ok()) {
        note(root.status());
      } else {
        note(root->RemoveTree(uid));
      }
    }
  }
  if (!r.mig.empty()) {
    if (!o_.nvml) {
      note(Status(ErrorCode::kUnavailable, "no NVML: cannot destroy the claim's MIG devices"));
    } else {
      Result<mig::LayoutLock> lock = mig::LayoutLock::Exclusive(o_.mig_lock_file);
      if (!lock.ok()) {
        note(lock.status());
      } else {
        for (auto it = r.mig.rbegin(); it != r.mig.rend(); ++it) note(DestroyMig(*it));
      }
    }
  }
  if (remove_record && first.ok()) {
    if (std::error_code ec; fs::remove(RecordPath(uid), ec), ec) {
      note(Status(ErrorCode::kInternal, RecordPath(uid) + ": remove: " + ec.message()));
    }
  }
  return first;
}

Result<PrepareResult> NodePreparer::Prepare(const Claim& claim) {
  const std::string who = Who(claim.ref);
  if (!ValidUid(claim.ref.uid)) {
    return Status(ErrorCode::kInvalidInput, who + ": metadata.uid: not a Kubernetes UID");
  }
  std::lock_guard<std::mutex> lock(mu_);

  // Idempotent: a claim prepared before (this process or an earlier one) gets the same answer.
  if (Result<std::string> text = ReadFileBounded(RecordPath(claim.ref.uid), kMaxRecordBytes);
      text.ok()) {
    Result<Record> r = RecordFromJson(*text, RecordPath(claim.ref.uid));
    if (r.ok() && r->claim.uid == claim.ref.uid && r->complete) return ResultOf(*r);
    // An interrupted prepare (or a damaged record): undo what it names and what lies under the
    // claim's fixed names, then start over.
    spdlog::warn("event=dra_prepare_redo file={} reason=\"{}\"", RecordPath(claim.ref.uid),
                 r.ok() ? (r->claim.uid == claim.ref.uid ? std::string("interrupted prepare")
                                                         : std::string("another claim's record"))
                        : r.status().message());
    Record empty;
    empty.claim = claim.ref;
    if (r.ok()) empty.mig = r->mig;
    if (Status s = Undo(empty, true); !s.ok()) {
      return Status(s.code(), who + ": cleaning up an earlier prepare: " + s.message());
    }
  }

  // Decide everything before touching anything.
  for (const OpaqueConfig& c : claim.configs) {
    if (c.driver != kDriverName) continue;
    if (Result<DeviceConfig> d = ParseDeviceConfig(c); !d.ok()) return d.status();
  }
  Record rec;
  rec.claim = claim.ref;
  std::vector<DevicePlan> plans;
  std::map<std::string, uint64_t> share_bytes;  // GPU UUID → bytes, in first-seen order below
  std::vector<std::string> share_order;
  std::optional<MpsSettings> mps_settings;
  std::vector<const gpu::Gpu*> mps_gpus;
  for (size_t i = 0; i < claim.devices.size(); ++i) {
    const AllocatedDevice& a = claim.devices[i];
    if (a.driver != kDriverName) continue;
    const std::string at = who + ": status.allocation.devices.results[" + std::to_string(i) +
                           "] (" + a.device + ")";
    if (!o_.node_name.empty() && a.pool != o_.node_name) {
      return Status(ErrorCode::kInvalidInput,
                    at + ": pool " + a.pool + " is not this node (" + o_.node_name + ")");
    }
    std::optional<DeviceName> name = ParseDeviceName(a.device);
    if (!name) return Status(ErrorCode::kInvalidInput, at + ": not a device this driver publishes");
    DevicePlan p;
    p.allocated = &a;
    p.name = *name;
    for (const gpu::Gpu& g : o_.inventory.gpus) {
      if (g.index == name->gpu_index) p.gpu = &g;
    }
    if (p.gpu == nullptr) return Status(ErrorCode::kNotFound, at + ": no such GPU on this node");
    const ConfigKind kind = name->kind == DeviceKind::kMig ? ConfigKind::kMigDevice : ConfigKind::kGpu;
    Result<std::optional<DeviceConfig>> config = ConfigFor(claim.configs, a.request, kind);
    if (!config.ok()) return config.status();
    p.config = *config;
    if (p.config && p.config->strategy == SharingStrategy::kMps) {
      if (!o_.mps) {
        return Status(ErrorCode::kUnavailable,
                      at + ": " + p.config->where + " asks for MPS; this node runs no MPS control");
      }
      if (mps_settings && !(*mps_settings == p.config->mps)) {
        return Status(ErrorCode::kInvalidInput,
                      at + ": " + p.config->where +
                          ": MPS settings differ from another device's in this claim (one MPS "
                          "daemon per claim)");
      }
      mps_settings = p.config->mps;
      if (std::find(mps_gpus.begin(), mps_gpus.end(), p.gpu) == mps_gpus.end()) {
        mps_gpus.push_back(p.gpu);
      }
    }
    if (!a.share_id.empty() && !ValidUid(a.share_id)) {
      return Status(ErrorCode::kInvalidInput, at + ": shareID: not a UID");
    }
    if (name->kind == DeviceKind::kMemoryShare) {
      auto it = a.consumed.find("memory");
      if (it == a.consumed.end()) it = a.consumed.find(std::string(kAttributeDomain) + "/memory");
      if (it == a.consumed.end() || it->second <= 0) {
        return Status(ErrorCode::kInvalidInput, at + ": consumedCapacity.memory: missing or not "
                                                     "above 0 (a memory share needs its size)");
      }
      if (o_.cuda_library.empty()) {
        return Status(ErrorCode::kUnavailable,
                      at + ": memory shares need libgpulet-cuda (no library configured)");
      }
      if (!share_bytes.contains(p.gpu->uuid)) share_order.push_back(p.gpu->uuid);
      // Saturating: shares of one GPU add up, and no sum of tenant numbers wraps around.
      uint64_t& sum = share_bytes[p.gpu->uuid];
      sum = std::min<uint64_t>(sum + static_cast<uint64_t>(it->second), UINT64_MAX / 2);
    }
    if (name->kind == DeviceKind::kMig) {
      if (!o_.nvml) {
        return Status(ErrorCode::kUnavailable, at + ": dynamic MIG needs NVML (none loaded)");
      }
      MigRecord m;
      m.gpu = p.gpu->index;
      m.gpu_uuid = p.gpu->uuid;
      m.profile = name->mig_profile;  // the slug until created
      m.start = name->mig_start;
      p.mig_index = rec.mig.size();
      rec.mig.push_back(m);
    }
    plans.push_back(std::move(p));
  }
  if (share_order.size() > cudashim::kMaxGpus) {
    return Status(ErrorCode::kInvalidInput, who + ": memory shares of more than " +
                                                std::to_string(cudashim::kMaxGpus) + " GPUs");
  }

  // Do it; on any failure undo everything done so far.
  auto fail = [&](Status s) -> Status {
    Status undo = Undo(rec, true);
    std::string message = who + ": " + s.message();
    if (undo.ok()) {
      message += "; everything prepared for the claim was undone";
    } else {
      message += "; undoing failed (" + undo.message() + "): Unprepare retries it";
      if (Status w = WriteRecord(rec); !w.ok()) message += " (record: " + w.message() + ")";
    }
    spdlog::warn("event=dra_prepare_failed claim={}/{} uid={} error=\"{}\"",
                 claim.ref.namespace_, claim.ref.name, claim.ref.uid, message);
    return Status(s.code(), message);
  };

  if (!rec.mig.empty()) {
    // Journal first: a crash between the create and the final record leaves a record that says
    // which placements to look for.
    if (Status s = WriteRecord(rec); !s.ok()) return fail(s);
    Status created;
    {
      // Released before any undo, which takes it again (flock: a second open of the file in
      // this process would wait for the first).
      Result<mig::LayoutLock> lock = mig::LayoutLock::Exclusive(o_.mig_lock_file);
      if (!lock.ok()) created = lock.status();
      for (MigRecord& m : rec.mig) {
        if (!created.ok()) break;
        const std::string slug = m.profile;
        m.profile.clear();
        created = CreateMig(m, slug);
        if (m.profile.empty()) m.profile = slug;  // never created; nothing to find by it
        if (created.ok()) created = WriteRecord(rec);
      }
    }
    if (!created.ok()) return fail(created);
  }

  // Memory limits: one directory per claim, every shared GPU's limit in one limits file.
  std::optional<cudashim::LimitsEdits> limits;
  if (!share_order.empty()) {
    std::vector<cudashim::GpuLimit> gpus;
    for (const std::string& uuid : share_order) gpus.push_back({uuid, share_bytes[uuid], 0});
    rec.limits_dir = true;
    Result<cudashim::LimitsEdits> e = cudashim::CreateLimitsDir(
        LimitsRoot(), claim.ref.uid, o_.cuda_library, gpus, o_.memory_passthrough);
    if (!e.ok()) return fail(e.status());
    limits = std::move(e).value();
  }

  std::optional<MpsDaemonDirs> mps_dirs;
  if (mps_settings) {
    MpsRequest req;
    req.claim_uid = claim.ref.uid;
    for (const gpu::Gpu* g : mps_gpus) {
      req.gpu_uuids.push_back(g->uuid);
      req.gpu_indices.push_back(g->index);
      req.memory_bytes.push_back(g->memory_mib * 1024 * 1024);
    }
    req.active_thread_percentage = mps_settings->active_thread_percentage;
    req.pinned_memory_bytes = mps_settings->pinned_memory_bytes;
    rec.mps = true;
    Result<MpsDaemonDirs> dirs = o_.mps->Start(req);
    if (!dirs.ok()) return fail(dirs.status());
    mps_dirs = *dirs;
  }

  // The CDI spec.
  const NvidiaCdiDevices nvidia = FindNvidiaCdiDevices(o_.nvidia_spec_dirs);
  CdiSpec spec;
  bool own_driver_edits = false;
  for (const DevicePlan& p : plans) {
    const AllocatedDevice& a = *p.allocated;
    DeviceRecord d;
    d.prepared.requests = {RequestBase(a.request)};
    d.prepared.pool = a.pool;
    d.prepared.device = a.device;
    d.prepared.share_id = a.share_id;
    d.uuid = p.gpu->uuid;
    if (p.config) d.sharing = SharingStrategyName(p.config->strategy);
    CdiEdits edits;
    std::string nvidia_name;
    if (p.name.kind != DeviceKind::kMig) {
      if (nvidia.Has(p.gpu->uuid)) {
        nvidia_name = p.gpu->uuid;
      } else if (nvidia.Has(std::to_string(p.gpu->index))) {
        nvidia_name = std::to_string(p.gpu->index);
      }
    }
    if (!nvidia_name.empty()) {
      d.prepared.cdi_device_ids.push_back(QualifiedDeviceName(kNvidiaCdiKind, nvidia_name));
    } else {
      Result<CdiDeviceNode> node =
          DeviceNodeEdit(o_.driver_root, o_.host_driver_root, p.gpu->device_path());
      if (!node.ok()) return fail(node.status());
      edits.device_nodes.push_back(*node);
      own_driver_edits = true;
    }
    if (p.name.kind == DeviceKind::kMig) {
      const MigRecord& m = rec.mig[p.mig_index];
      d.mig_uuid = m.mig_uuid;
      for (const std::string& cap : {m.gi_cap_path, m.ci_cap_path}) {
        if (cap.empty()) {
          return fail(Status(ErrorCode::kNotFound, m.mig_uuid + ": capability node unknown "
                                                                "(/proc/driver/nvidia-caps)"));
        }
        Result<CdiDeviceNode> node = DeviceNodeEdit(o_.driver_root, o_.host_driver_root, cap);
        if (!node.ok()) return fail(node.status());
        edits.device_nodes.push_back(*node);
      }
    }
    if (p.name.kind == DeviceKind::kMemoryShare && limits) {
      d.memory_limit = share_bytes[p.gpu->uuid];
      for (const cudashim::LimitsMount& m : limits->mounts) {
        edits.mounts.push_back({m.host_path, m.container_path,
                                m.read_only ? ReadOnlyMountOptions() : ReadWriteMountOptions()});
      }
      for (const auto& [k, v] : limits->env) edits.env.push_back(k + "=" + v);
    }
    if (mps_dirs && p.config && p.config->strategy == SharingStrategy::kMps) {
      edits.mounts.push_back({mps_dirs->pipe_dir, kMpsContainerPipeDir, ReadWriteMountOptions()});
      edits.mounts.push_back({mps_dirs->shm_dir, "/dev/shm", ReadWriteMountOptions()});
      edits.env.push_back(std::string("CUDA_MPS_PIPE_DIRECTORY=") + kMpsContainerPipeDir);
    }
    if (!edits.empty()) {
      const std::string cdi_name = claim.ref.uid + "-" + a.device +
                                   (a.share_id.empty() ? "" : "-" + a.share_id);
      // One CDI device per (device, share): two results of one device share it.
      auto same = std::find_if(spec.devices.begin(), spec.devices.end(),
                               [&](const CdiDevice& x) { return x.name == cdi_name; });
      if (same == spec.devices.end()) {
        spec.devices.push_back({cdi_name, edits});
      } else {
        same->edits.Merge(edits);
      }
      d.prepared.cdi_device_ids.push_back(QualifiedDeviceName(kCdiKind, cdi_name));
    }
    rec.devices.push_back(std::move(d));
  }
  if (own_driver_edits) {
    Result<const DriverFiles*> files = Driver();
    if (!files.ok()) return fail(files.status());
    spec.edits = CommonDriverEdits(**files, o_.host_driver_root, o_.cdi_hook_binary);
  }
  // What the container holds, for tools inside it (`gpulet slurm pod` writes gres.conf from it):
  // GPULET_DRA_DEVICES=<device>=<UUID>,… (a MIG device's own UUID). Spec-wide, so every device
  // of the claim carries it; a claim served by nvidia-ctk's spec alone gets a device for it.
  std::string devices_env;
  for (const DeviceRecord& d : rec.devices) {
    const std::string entry = d.prepared.device + "=" + (d.mig_uuid.empty() ? d.uuid : d.mig_uuid);
    if (("," + devices_env + ",").find("," + entry + ",") != std::string::npos) continue;
    devices_env += (devices_env.empty() ? "" : ",") + entry;
  }
  if (!devices_env.empty()) {
    const std::string env = std::string(kDevicesEnv) + "=" + devices_env;
    if (spec.devices.empty()) {
      const std::string cdi_name = claim.ref.uid + "-devices";
      CdiEdits edits;
      edits.env.push_back(env);
      spec.devices.push_back({cdi_name, edits});
      for (DeviceRecord& d : rec.devices) {
        d.prepared.cdi_device_ids.push_back(QualifiedDeviceName(kCdiKind, cdi_name));
      }
    } else {
      spec.edits.env.push_back(env);
    }
  }
  if (!spec.devices.empty()) {
    rec.spec_file = SpecPath(claim.ref.uid);
    std::error_code ec;
    fs::create_directories(o_.cdi_root, ec);
    if (ec) return fail(Status(ErrorCode::kInternal, o_.cdi_root + ": create: " + ec.message()));
    if (Status s = WriteFileAtomic(rec.spec_file, CdiSpecToJson(spec).dump(2) + "\n", 0644);
        !s.ok()) {
      return fail(s);
    }
  }
  rec.complete = true;
  if (Status s = WriteRecord(rec); !s.ok()) return fail(s);
  spdlog::info("event=dra_prepared claim={}/{} uid={} devices={} mig={} memory_shares={} mps={}",
               claim.ref.namespace_, claim.ref.name, claim.ref.uid, rec.devices.size(),
               rec.mig.size(), share_order.size(), rec.mps);
  return ResultOf(rec);
}

Status NodePreparer::Unprepare(const ClaimRef& claim, const std::string& record_json) {
  const std::string who = Who(claim);
  if (!ValidUid(claim.uid)) {
    return Status(ErrorCode::kInvalidInput, who + ": metadata.uid: not a Kubernetes UID");
  }
  std::lock_guard<std::mutex> lock(mu_);
  Record r;
  r.claim = claim;
  // The record handed in, else the one on disk (a Prepare whose answer was lost), else only the
  // claim's fixed names (spec, limits directory).
  Result<Record> given = record_json.empty()
                             ? Result<Record>(Status(ErrorCode::kNotFound, "no record"))
                             : RecordFromJson(record_json, who + ": record");
  if (given.ok() && given->claim.uid == claim.uid) {
    r = std::move(given).value();
  } else if (Result<std::string> text = ReadFileBounded(RecordPath(claim.uid), kMaxRecordBytes);
             text.ok()) {
    if (Result<Record> disk = RecordFromJson(*text, RecordPath(claim.uid));
        disk.ok() && disk->claim.uid == claim.uid) {
      r = std::move(disk).value();
    }
  }
  // The on-disk record may know MIG devices a lost answer's record_json does not (a journal).
  if (Result<std::string> text = ReadFileBounded(RecordPath(claim.uid), kMaxRecordBytes);
      text.ok() && r.mig.empty()) {
    if (Result<Record> disk = RecordFromJson(*text, RecordPath(claim.uid));
        disk.ok() && disk->claim.uid == claim.uid) {
      r.mig = disk->mig;
      r.mps = r.mps || disk->mps;
    }
  }
  if (o_.mps) r.mps = true;  // Stop is idempotent: also ends a daemon a crash left unrecorded
  if (Status s = Undo(r, true); !s.ok()) return Status(s.code(), who + ": unprepare: " + s.message());
  spdlog::info("event=dra_unprepared claim={}/{} uid={} mig={}", claim.namespace_, claim.name,
               claim.uid, r.mig.size());
  return Status::Ok();
}

bool AbsolutePath(const std::string& p) { return !p.empty() && p.front() == '/'; }

}  // namespace

Result<std::unique_ptr<Preparer>> MakeNodePreparer(NodePreparerOptions options) {
  const std::pair<const char*, const std::string*> paths[] = {
      {"state_dir", &options.state_dir},
      {"cdi_root", &options.cdi_root},
      {"driver_root", &options.driver_root},
  };
  for (const auto& [name, value] : paths) {
    if (!AbsolutePath(*value)) {
      return Status(ErrorCode::kInvalidInput,
                    std::string("dra preparer: ") + name + ": must be an absolute path, got \"" +
                        *value + "\"");
    }
  }
  if (!options.host_driver_root.empty() && !AbsolutePath(options.host_driver_root)) {
    return Status(ErrorCode::kInvalidInput, "dra preparer: host_driver_root: must be absolute");
  }
  return std::unique_ptr<Preparer>(std::make_unique<NodePreparer>(std::move(options)));
}

size_t ForgetDraMadeMigInstances(const std::string& state_dir, std::vector<mig::GpuState>& state) {
  std::error_code ec;
  size_t removed = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(state_dir + "/" + kClaimsDir, ec)) {
    if (e.path().extension() != ".json") continue;
    Result<std::string> text = ReadFileBounded(e.path().string(), kMaxRecordBytes);
    Result<Record> r = text.ok() ? RecordFromJson(*text, e.path().string())
                                 : Result<Record>(text.status());
    if (!r.ok()) {
      spdlog::warn("event=dra_record_unread file={} error=\"{}\"", e.path().string(),
                   r.status().message());
      continue;
    }
    for (const MigRecord& m : r->mig) {
      if (!m.gi) continue;  // only intended: nothing was made
      for (mig::GpuState& g : state) {
        if (g.index != m.gpu || (!m.gpu_uuid.empty() && g.uuid != m.gpu_uuid)) continue;
        const size_t before = g.instances.size();
        std::erase_if(g.instances, [&](const mig::GpuInstance& i) {
          return i.start == m.start && i.gi == m.gi && i.profile == m.profile;
        });
        removed += before - g.instances.size();
      }
    }
  }
  return removed;
}

}  // namespace gpulet::dra
