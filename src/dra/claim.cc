// Parsing a resource.k8s.io/v1 ResourceClaim into dra::Claim (claim.h). The object comes from the
// API server, which validated it, but its contents are written by a tenant: every list and string
// is bounded here again with the API's own limits (kubernetes/api resource/v1/types.go:
// AllocationResultsMaxSize 32, DeviceConfigMaxSize 32, ResourceClaimReservedForMaxSize 256,
// opaque parameters 10 KiB, names as DNS labels/subdomains), and an error names the field.
#include <nlohmann/json.hpp>

#include "dra/claim.h"
#include "dra/names.h"
#include "k8s/quantity.h"

namespace gpulet::dra {
namespace {

constexpr size_t kMaxResults = 32;          // AllocationResultsMaxSize
constexpr size_t kMaxConfigs = 32;          // DeviceConfigMaxSize
constexpr size_t kMaxConfigRequests = 32;   // DeviceRequestsMaxSize
constexpr size_t kMaxReservedFor = 256;     // ResourceClaimReservedForMaxSize
constexpr size_t kMaxOpaqueBytes = 10240;   // OpaqueParametersMaxLength
constexpr size_t kMaxCapacities = 32;       // attributes + capacities per device
constexpr size_t kMaxNodeNames = 64;        // names in a nodeSelector we keep
constexpr size_t kDnsLabel = 63, kDnsSubdomain = 253, kUid = 128;

class Parser {
 public:
  explicit Parser(std::string where) : where_(std::move(where)) {}

  Status Error(const std::string& field, const std::string& problem) const {
    return Status(ErrorCode::kInvalidInput, where_ + ": " + field + ": " + problem);
  }

  // A string field: absent is "" when optional; bounded by max.
  Result<std::string> String(const nlohmann::json& obj, const char* key, const std::string& field,
                             size_t max, bool required) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) {
      if (required) return Error(field, "missing");
      return std::string();
    }
    if (!it->is_string()) return Error(field, "not a string");
    const std::string& s = it->get_ref<const std::string&>();
    if (s.size() > max) {
      return Error(field, "longer than " + std::to_string(max) + " bytes (" +
                              std::to_string(s.size()) + ")");
    }
    if (required && s.empty()) return Error(field, "empty");
    return s;
  }

  // An optional list field: nullptr when absent; an error when not a list or too long.
  Result<const nlohmann::json*> List(const nlohmann::json& obj, const char* key,
                                     const std::string& field, size_t max) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return static_cast<const nlohmann::json*>(nullptr);
    if (!it->is_array()) return Error(field, "not a list");
    if (it->size() > max) {
      return Error(field, std::to_string(it->size()) + " entries, more than the API's " +
                              std::to_string(max));
    }
    return &*it;
  }

  Result<const nlohmann::json*> Object(const nlohmann::json& obj, const char* key,
                                       const std::string& field) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return static_cast<const nlohmann::json*>(nullptr);
    if (!it->is_object()) return Error(field, "not an object");
    return &*it;
  }

  const std::string& where() const { return where_; }
  void set_where(std::string w) { where_ = std::move(w); }

 private:
  std::string where_;
};

bool IsDnsLabel(const std::string& s) {
  if (s.empty() || s.size() > kDnsLabel) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return s.front() != '-' && s.back() != '-';
}

// A request name: a DNS label, or "<request>/<subrequest>" (two labels).
bool IsRequestName(const std::string& s) {
  const size_t slash = s.find('/');
  if (slash == std::string::npos) return IsDnsLabel(s);
  return IsDnsLabel(s.substr(0, slash)) && IsDnsLabel(s.substr(slash + 1));
}

Result<AllocatedDevice> ParseResult(const Parser& p, const nlohmann::json& r,
                                    const std::string& field) {
  if (!r.is_object()) return p.Error(field, "not an object");
  AllocatedDevice d;
  auto str = [&](const char* key, size_t max, bool required, std::string* out) -> Status {
    Result<std::string> v = p.String(r, key, field + "." + key, max, required);
    if (!v.ok()) return v.status();
    *out = std::move(v).value();
    return Status::Ok();
  };
  for (Status s : {str("request", 2 * kDnsLabel + 1, true, &d.request),
                   str("driver", kDnsSubdomain, true, &d.driver),
                   str("pool", kDnsSubdomain, true, &d.pool),
                   str("device", kDnsLabel, true, &d.device),
                   str("shareID", kUid, false, &d.share_id)}) {
    if (!s.ok()) return s;
  }
  if (!IsRequestName(d.request)) {
    return p.Error(field + ".request", "\"" + d.request + "\" is not a request name");
  }
  if (auto it = r.find("adminAccess"); it != r.end() && !it->is_null()) {
    if (!it->is_boolean()) return p.Error(field + ".adminAccess", "not a boolean");
    d.admin_access = it->get<bool>();
  }
  Result<const nlohmann::json*> consumed = p.Object(r, "consumedCapacity", field + ".consumedCapacity");
  if (!consumed.ok()) return consumed.status();
  if (*consumed != nullptr) {
    if ((*consumed)->size() > kMaxCapacities) {
      return p.Error(field + ".consumedCapacity",
                     "more than " + std::to_string(kMaxCapacities) + " entries");
    }
    for (auto it = (*consumed)->begin(); it != (*consumed)->end(); ++it) {
      const std::string f = field + ".consumedCapacity[" + it.key().substr(0, 100) + "]";
      if (it.key().empty() || it.key().size() > kDnsSubdomain + 1 + 32) {
        return p.Error(f, "not a capacity name");
      }
      int64_t value = 0;
      if (it->is_string()) {
        Result<int64_t> q = k8s::ParseWholeQuantity(it->get_ref<const std::string&>());
        if (!q.ok()) return p.Error(f, q.status().message());
        value = *q;
      } else if (it->is_number_unsigned() || it->is_number_integer()) {
        if (it->is_number_integer() && it->get<int64_t>() < 0) return p.Error(f, "negative");
        if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
          return p.Error(f, "too large");
        }
        value = it->get<int64_t>();
      } else {
        return p.Error(f, "not a quantity");
      }
      d.consumed[it.key()] = value;
    }
  }
  return d;
}

Result<OpaqueConfig> ParseConfig(const Parser& p, const nlohmann::json& c, const std::string& field,
                                 bool* ours) {
  *ours = false;
  if (!c.is_object()) return p.Error(field, "not an object");
  OpaqueConfig cfg;
  cfg.where = p.where() + ": " + field;
  Result<std::string> source = p.String(c, "source", field + ".source", 32, false);
  if (!source.ok()) return source.status();
  if (*source == "FromClass") {
    cfg.from_class = true;
  } else if (!source->empty() && *source != "FromClaim") {
    return p.Error(field + ".source", "\"" + *source + "\" is neither FromClass nor FromClaim");
  }
  Result<const nlohmann::json*> requests = p.List(c, "requests", field + ".requests",
                                                  kMaxConfigRequests);
  if (!requests.ok()) return requests.status();
  if (*requests != nullptr) {
    for (size_t i = 0; i < (*requests)->size(); ++i) {
      const nlohmann::json& r = (**requests)[i];
      const std::string f = field + ".requests[" + std::to_string(i) + "]";
      if (!r.is_string() || !IsRequestName(r.get_ref<const std::string&>())) {
        return p.Error(f, "not a request name");
      }
      cfg.requests.push_back(r.get<std::string>());
    }
  }
  Result<const nlohmann::json*> opaque = p.Object(c, "opaque", field + ".opaque");
  if (!opaque.ok()) return opaque.status();
  if (*opaque == nullptr) return cfg;  // another kind of configuration: not ours
  Result<std::string> driver =
      p.String(**opaque, "driver", field + ".opaque.driver", kDnsSubdomain, true);
  if (!driver.ok()) return driver.status();
  cfg.driver = *driver;
  if (cfg.driver != kDriverName) return cfg;
  auto params = (*opaque)->find("parameters");
  if (params == (*opaque)->end() || params->is_null()) {
    return p.Error(field + ".opaque.parameters", "missing");
  }
  cfg.parameters_json = params->dump();
  if (cfg.parameters_json.size() > kMaxOpaqueBytes) {
    return p.Error(field + ".opaque.parameters",
                   "larger than 10 KiB (" + std::to_string(cfg.parameters_json.size()) + " bytes)");
  }
  *ours = true;
  return cfg;
}

Status ParseNodeSelector(const Parser& p, const nlohmann::json& sel, std::vector<std::string>* out) {
  const std::string field = "status.allocation.nodeSelector";
  if (!sel.is_object()) return p.Error(field, "not an object");
  Result<const nlohmann::json*> terms = p.List(sel, "nodeSelectorTerms", field + ".nodeSelectorTerms", 64);
  if (!terms.ok()) return terms.status();
  if (*terms == nullptr) return Status::Ok();
  for (size_t t = 0; t < (*terms)->size(); ++t) {
    const nlohmann::json& term = (**terms)[t];
    const std::string tf = field + ".nodeSelectorTerms[" + std::to_string(t) + "]";
    if (!term.is_object()) return p.Error(tf, "not an object");
    Result<const nlohmann::json*> fields = p.List(term, "matchFields", tf + ".matchFields", 64);
    if (!fields.ok()) return fields.status();
    if (*fields == nullptr) continue;
    for (size_t i = 0; i < (*fields)->size(); ++i) {
      const nlohmann::json& m = (**fields)[i];
      const std::string mf = tf + ".matchFields[" + std::to_string(i) + "]";
      if (!m.is_object()) return p.Error(mf, "not an object");
      if (m.value("key", "") != "metadata.name" || m.value("operator", "") != "In") continue;
      Result<const nlohmann::json*> values = p.List(m, "values", mf + ".values", kMaxNodeNames);
      if (!values.ok()) return values.status();
      if (*values == nullptr) continue;
      for (const nlohmann::json& v : **values) {
        if (!v.is_string() || v.get_ref<const std::string&>().size() > kDnsSubdomain) {
          return p.Error(mf + ".values", "not a node name");
        }
        if (out->size() >= kMaxNodeNames) return p.Error(mf + ".values", "too many node names");
        out->push_back(v.get<std::string>());
      }
    }
  }
  return Status::Ok();
}

// Whether JSON text nests deeper than `max` (the parser recurses once per level).
bool NestsDeeperThan(std::string_view text, int max) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') { if (++depth > max) return true; }
    else if (c == '}' || c == ']') --depth;
  }
  return false;
}

}  // namespace

Result<Claim> ParseClaim(const nlohmann::json& object) {
  Parser p("ResourceClaim");
  if (!object.is_object()) return p.Error("(object)", "not a JSON object");
  if (auto kind = object.find("kind"); kind != object.end() && kind->is_string() &&
                                       kind->get_ref<const std::string&>() != "ResourceClaim") {
    return p.Error("kind", "\"" + kind->get<std::string>().substr(0, 64) + "\", not ResourceClaim");
  }
  Result<const nlohmann::json*> meta = p.Object(object, "metadata", "metadata");
  if (!meta.ok()) return meta.status();
  if (*meta == nullptr) return p.Error("metadata", "missing");
  Claim claim;
  Result<std::string> ns = p.String(**meta, "namespace", "metadata.namespace", kDnsLabel, true);
  if (!ns.ok()) return ns.status();
  Result<std::string> name = p.String(**meta, "name", "metadata.name", kDnsSubdomain, true);
  if (!name.ok()) return name.status();
  Result<std::string> uid = p.String(**meta, "uid", "metadata.uid", kUid, true);
  if (!uid.ok()) return uid.status();
  claim.ref = ClaimRef{*ns, *name, *uid};
  p.set_where("ResourceClaim " + *ns + "/" + *name);
  if (auto del = (*meta)->find("deletionTimestamp"); del != (*meta)->end() && !del->is_null()) {
    claim.deleting = true;
  }

  Result<const nlohmann::json*> status = p.Object(object, "status", "status");
  if (!status.ok()) return status.status();
  if (*status == nullptr) return claim;
  Result<const nlohmann::json*> reserved =
      p.List(**status, "reservedFor", "status.reservedFor", kMaxReservedFor);
  if (!reserved.ok()) return reserved.status();
  if (*reserved != nullptr) {
    for (size_t i = 0; i < (*reserved)->size(); ++i) {
      const nlohmann::json& r = (**reserved)[i];
      const std::string f = "status.reservedFor[" + std::to_string(i) + "]";
      if (!r.is_object()) return p.Error(f, "not an object");
      Result<std::string> ruid = p.String(r, "uid", f + ".uid", kUid, true);
      if (!ruid.ok()) return ruid.status();
      claim.reserved_for_uids.push_back(*ruid);
    }
  }
  Result<const nlohmann::json*> allocation = p.Object(**status, "allocation", "status.allocation");
  if (!allocation.ok()) return allocation.status();
  if (*allocation == nullptr) return claim;
  claim.allocated = true;
  if (auto sel = (*allocation)->find("nodeSelector"); sel != (*allocation)->end() && !sel->is_null()) {
    Status s = ParseNodeSelector(p, *sel, &claim.node_names);
    if (!s.ok()) return s;
  }
  Result<const nlohmann::json*> devices =
      p.Object(**allocation, "devices", "status.allocation.devices");
  if (!devices.ok()) return devices.status();
  if (*devices == nullptr) return claim;
  Result<const nlohmann::json*> results =
      p.List(**devices, "results", "status.allocation.devices.results", kMaxResults);
  if (!results.ok()) return results.status();
  if (*results != nullptr) {
    for (size_t i = 0; i < (*results)->size(); ++i) {
      Result<AllocatedDevice> d = ParseResult(
          p, (**results)[i], "status.allocation.devices.results[" + std::to_string(i) + "]");
      if (!d.ok()) return d.status();
      if (d->driver == kDriverName) claim.devices.push_back(std::move(d).value());
    }
  }
  Result<const nlohmann::json*> configs =
      p.List(**devices, "config", "status.allocation.devices.config", kMaxConfigs);
  if (!configs.ok()) return configs.status();
  if (*configs != nullptr) {
    std::vector<OpaqueConfig> from_class, from_claim;
    for (size_t i = 0; i < (*configs)->size(); ++i) {
      bool ours = false;
      Result<OpaqueConfig> c = ParseConfig(
          p, (**configs)[i], "status.allocation.devices.config[" + std::to_string(i) + "]", &ours);
      if (!c.ok()) return c.status();
      if (!ours) continue;
      (c->from_class ? from_class : from_claim).push_back(std::move(c).value());
    }
    // Class configs first: a claim's own config overrides its class's (lower precedence first).
    claim.configs = std::move(from_class);
    for (OpaqueConfig& c : from_claim) claim.configs.push_back(std::move(c));
  }
  return claim;
}

Result<Claim> ParseClaimJson(std::string_view text) {
  if (text.size() > kMaxClaimBytes) {
    return Status(ErrorCode::kInvalidInput,
                  "ResourceClaim: " + std::to_string(text.size()) + " bytes, more than " +
                      std::to_string(kMaxClaimBytes));
  }
  if (NestsDeeperThan(text, 64)) {
    return Status(ErrorCode::kInvalidInput, "ResourceClaim: the JSON nests deeper than 64 levels");
  }
  nlohmann::json object = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (object.is_discarded()) {
    return Status(ErrorCode::kInvalidInput, "ResourceClaim: the body is not JSON");
  }
  return ParseClaim(object);
}

}  // namespace gpulet::dra
