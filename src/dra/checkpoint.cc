// The kubelet plugin's checkpoint file (checkpoint.h).
#include "dra/checkpoint.h"

#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/fnv.h"

namespace gpulet::dra {
namespace {

constexpr int kVersion = 1;


const char* StateName(CheckpointEntry::State s) {
  return s == CheckpointEntry::State::kPrepared ? "prepared" : "preparing";
}

nlohmann::json ClaimsJson(const Checkpoint& cp) {
  nlohmann::json claims = nlohmann::json::object();
  for (const auto& [uid, e] : cp.claims) {
    nlohmann::json devices = nlohmann::json::array();
    for (const CheckpointDevice& d : e.devices) {
      devices.push_back({{"requests", d.requests},
                         {"pool", d.pool},
                         {"device", d.device},
                         {"shareID", d.share_id},
                         {"cdiDeviceIDs", d.cdi_device_ids},
                         {"adminAccess", d.admin_access}});
    }
    claims[uid] = {{"namespace", e.ref.namespace_},
                   {"name", e.ref.name},
                   {"state", StateName(e.state)},
                   {"devices", std::move(devices)},
                   {"record", e.record_json}};
  }
  return claims;
}

// A string field of `obj`, or an error naming `field`.
Result<std::string> Str(const nlohmann::json& obj, const char* key, const std::string& field,
                        const std::string& source) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_string()) {
    return Status(ErrorCode::kInvalidInput, source + ": " + field + "." + key + ": not a string");
  }
  return it->get<std::string>();
}

Result<std::vector<std::string>> Strings(const nlohmann::json& obj, const char* key,
                                         const std::string& field, const std::string& source) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_array()) {
    return Status(ErrorCode::kInvalidInput, source + ": " + field + "." + key + ": not a list");
  }
  std::vector<std::string> out;
  for (const nlohmann::json& v : *it) {
    if (!v.is_string()) {
      return Status(ErrorCode::kInvalidInput,
                    source + ": " + field + "." + key + ": holds a non-string");
    }
    out.push_back(v.get<std::string>());
  }
  return out;
}

std::string Aside(const std::string& path, const char* why) {
  const std::string target = path + "." + why + "-" + std::to_string(std::time(nullptr));
  if (std::rename(path.c_str(), target.c_str()) != 0) {
    spdlog::error("event=dra_checkpoint_move_failed path={} target={} error=\"{}\"", path, target,
                  std::strerror(errno));
    return "";
  }
  return target;
}

}  // namespace

std::string SerializeCheckpoint(const Checkpoint& cp) {
  nlohmann::json claims = ClaimsJson(cp);
  const std::string sealed = cp.node_name + "\n" + cp.boot_id + "\n" +
                             (cp.rebuild_pending ? "1" : "0") + "\n" + claims.dump();
  nlohmann::json doc = {{"version", kVersion},
                        {"node", cp.node_name},
                        {"bootID", cp.boot_id},
                        {"rebuildPending", cp.rebuild_pending},
                        {"claims", std::move(claims)},
                        {"checksum", Fnv64Hex(sealed)}};
  return doc.dump(1) + "\n";
}

Result<Checkpoint> ParseCheckpoint(const std::string& text, const std::string& source) {
  auto bad = [&](const std::string& what) {
    return Status(ErrorCode::kInvalidInput, source + ": " + what);
  };
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return bad("not JSON");
  if (!doc.is_object()) return bad("not a JSON object");
  auto version = doc.find("version");
  if (version == doc.end() || !version->is_number_integer()) return bad("version: missing");
  if (version->get<int64_t>() != kVersion) {
    return bad("version " + version->dump() + " is not " + std::to_string(kVersion));
  }
  Checkpoint cp;
  Result<std::string> node = Str(doc, "node", "", source);
  if (!node.ok()) return node.status();
  Result<std::string> boot = Str(doc, "bootID", "", source);
  if (!boot.ok()) return boot.status();
  Result<std::string> checksum = Str(doc, "checksum", "", source);
  if (!checksum.ok()) return checksum.status();
  auto claims = doc.find("claims");
  if (claims == doc.end() || !claims->is_object()) return bad("claims: not an object");
  auto pending = doc.find("rebuildPending");
  if (pending == doc.end() || !pending->is_boolean()) return bad("rebuildPending: not a boolean");
  cp.rebuild_pending = pending->get<bool>();
  const std::string sealed = *node + "\n" + *boot + "\n" + (cp.rebuild_pending ? "1" : "0") +
                             "\n" + claims->dump();
  if (Fnv64Hex(sealed) != *checksum) return bad("checksum does not match the contents");
  cp.node_name = *node;
  cp.boot_id = *boot;
  for (auto it = claims->begin(); it != claims->end(); ++it) {
    const std::string field = "claims[" + it.key() + "]";
    if (!it->is_object()) return bad(field + ": not an object");
    CheckpointEntry e;
    e.ref.uid = it.key();
    Result<std::string> ns = Str(*it, "namespace", field, source);
    if (!ns.ok()) return ns.status();
    Result<std::string> name = Str(*it, "name", field, source);
    if (!name.ok()) return name.status();
    Result<std::string> state = Str(*it, "state", field, source);
    if (!state.ok()) return state.status();
    Result<std::string> record = Str(*it, "record", field, source);
    if (!record.ok()) return record.status();
    e.ref.namespace_ = *ns;
    e.ref.name = *name;
    e.record_json = *record;
    if (*state == "prepared") {
      e.state = CheckpointEntry::State::kPrepared;
    } else if (*state == "preparing") {
      e.state = CheckpointEntry::State::kPreparing;
    } else {
      return bad(field + ".state: \"" + *state + "\" is neither prepared nor preparing");
    }
    auto devices = it->find("devices");
    if (devices == it->end() || !devices->is_array()) return bad(field + ".devices: not a list");
    for (size_t i = 0; i < devices->size(); ++i) {
      const nlohmann::json& d = (*devices)[i];
      const std::string df = field + ".devices[" + std::to_string(i) + "]";
      if (!d.is_object()) return bad(df + ": not an object");
      CheckpointDevice cd;
      Result<std::vector<std::string>> requests = Strings(d, "requests", df, source);
      if (!requests.ok()) return requests.status();
      Result<std::vector<std::string>> cdi = Strings(d, "cdiDeviceIDs", df, source);
      if (!cdi.ok()) return cdi.status();
      Result<std::string> pool = Str(d, "pool", df, source);
      if (!pool.ok()) return pool.status();
      Result<std::string> device = Str(d, "device", df, source);
      if (!device.ok()) return device.status();
      Result<std::string> share = Str(d, "shareID", df, source);
      if (!share.ok()) return share.status();
      auto admin = d.find("adminAccess");
      if (admin == d.end() || !admin->is_boolean()) return bad(df + ".adminAccess: not a boolean");
      cd.requests = *requests;
      cd.cdi_device_ids = *cdi;
      cd.pool = *pool;
      cd.device = *device;
      cd.share_id = *share;
      cd.admin_access = admin->get<bool>();
      e.devices.push_back(std::move(cd));
    }
    cp.claims.emplace(e.ref.uid, std::move(e));
  }
  return cp;
}

Status WriteCheckpoint(const std::string& path, const Checkpoint& checkpoint) {
  return WriteFileAtomic(path, SerializeCheckpoint(checkpoint), 0600);
}

Result<LoadedCheckpoint> LoadCheckpoint(const std::string& path, const std::string& node_name,
                                        const std::string& boot_id) {
  LoadedCheckpoint out;
  out.checkpoint.node_name = node_name;
  out.checkpoint.boot_id = boot_id;
  Result<std::string> text = ReadFileBounded(path, kMaxCheckpointBytes);
  if (!text.ok()) {
    if (text.status().code() == ErrorCode::kNotFound) return out;  // first start
    if (text.status().code() != ErrorCode::kInvalidInput) return text.status();
    // Larger than any checkpoint this plugin writes: corrupted.
    out.outcome = LoadedCheckpoint::Outcome::kCorrupt;
    out.problem = text.status().message();
  } else {
    Result<Checkpoint> cp = ParseCheckpoint(*text, path);
    if (!cp.ok()) {
      out.outcome = LoadedCheckpoint::Outcome::kCorrupt;
      out.problem = cp.status().message();
    } else if (cp->node_name != node_name) {
      out.outcome = LoadedCheckpoint::Outcome::kForeign;
      out.problem = path + ": written on node \"" + cp->node_name + "\", this is \"" + node_name + "\"";
    } else if (cp->boot_id != boot_id) {
      out.outcome = LoadedCheckpoint::Outcome::kForeign;
      out.problem = path + ": written in boot " + cp->boot_id + ", this boot is " + boot_id +
                    " (its CDI specs and MIG devices are gone)";
    } else {
      out.outcome = LoadedCheckpoint::Outcome::kLoaded;
      out.checkpoint = std::move(cp).value();
      return out;
    }
  }
  out.checkpoint.rebuild_pending = true;
  out.kept_aside =
      Aside(path, out.outcome == LoadedCheckpoint::Outcome::kCorrupt ? "corrupt" : "foreign");
  spdlog::error("event=dra_checkpoint_{} path={} kept_aside={} problem=\"{}\"",
                out.outcome == LoadedCheckpoint::Outcome::kCorrupt ? "corrupt" : "foreign", path,
                out.kept_aside.empty() ? "(not moved)" : out.kept_aside, out.problem);
  return out;
}

Result<std::string> ReadBootId(const std::string& path) {
  Result<std::string> text = ReadFileBounded(path, 4096);
  if (!text.ok()) return text.status();
  std::string id = text->substr(0, text->find('\n'));
  while (!id.empty() && (id.back() == ' ' || id.back() == '\r' || id.back() == '\t')) id.pop_back();
  if (id.empty() || id.size() > 64) {
    return Status(ErrorCode::kInvalidInput, path + ": not a boot ID");
  }
  return id;
}


}  // namespace gpulet::dra
