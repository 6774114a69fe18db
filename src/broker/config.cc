#include "broker/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <set>

#include "common/duration.h"
#include "common/files.h"

namespace gpulet::broker {
namespace {

// Thrown inside this file only; ParseBrokerConfig turns it into a Status.
struct ConfigError {
  std::string message;
};

class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void Fail(const YAML::Node& at, const std::string& field,
                         const std::string& problem) const {
    const int line = at.IsDefined() ? at.Mark().line + 1 : 0;
    throw ConfigError{source_ + ":" + std::to_string(line) + ": " + field + ": " + problem};
  }

  void CheckKeys(const YAML::Node& map, const std::string& field,
                 const std::set<std::string>& allowed) const {
    if (!map.IsMap()) Fail(map, field.empty() ? "(top)" : field, "must be a mapping");
    for (const auto& kv : map) {
      const std::string key = kv.first.Scalar();
      if (allowed.count(key) == 0) {
        std::string names;
        for (const auto& a : allowed) names += (names.empty() ? "" : ", ") + a;
        Fail(kv.first, field.empty() ? key : field + "." + key,
             "unknown field (known: " + names + ")");
      }
    }
  }

  std::string String(const YAML::Node& n, const std::string& field) const {
    if (!n.IsScalar()) Fail(n, field, "must be a string");
    return n.Scalar();
  }

  int Int(const YAML::Node& n, const std::string& field, int min, int max) const {
    if (!n.IsScalar()) Fail(n, field, "must be an integer");
    const std::string s = n.Scalar();
    int v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || p != s.data() + s.size()) {
      Fail(n, field, "must be an integer, got \"" + s + "\"");
    }
    if (v < min || v > max) {
      Fail(n, field,
           "must be between " + std::to_string(min) + " and " + std::to_string(max) + ", got " + s);
    }
    return v;
  }

  TimeMs Duration(const YAML::Node& n, const std::string& field, TimeMs min) const {
    if (!n.IsScalar()) Fail(n, field, "must be a duration such as 30s, 10m or 2h");
    // Bare numbers are seconds (documented since the first release).
    Result<std::chrono::milliseconds> v = ParseDuration(n.Scalar(), std::chrono::seconds(1));
    if (!v.ok()) {
      Fail(n, field, "must be a duration such as 30s, 10m or 2h, got \"" + n.Scalar() + "\"");
    }
    if (v->count() < min) {
      Fail(n, field, "must be at least " + FormatDuration(std::chrono::milliseconds(min)));
    }
    return v->count();
  }

  std::vector<std::string> Names(const YAML::Node& n, const std::string& field) const {
    if (!n.IsSequence()) Fail(n, field, "must be a list of names");
    std::vector<std::string> out;
    std::set<std::string> seen;
    for (size_t i = 0; i < n.size(); ++i) {
      const std::string f = field + "[" + std::to_string(i) + "]";
      std::string v = String(n[i], f);
      if (v.empty()) Fail(n[i], f, "must not be empty");
      if (!seen.insert(v).second) Fail(n[i], f, "\"" + v + "\" is listed twice");
      out.push_back(v);
    }
    return out;
  }

 private:
  std::string source_;
};

// "key=value" → (key, value); "key=value:Effect" for taints.
bool SplitPair(const std::string& s, std::string* key, std::string* value) {
  const size_t eq = s.find('=');
  if (eq == std::string::npos || eq == 0) return false;
  *key = s.substr(0, eq);
  *value = s.substr(eq + 1);
  return true;
}

// A DNS-1123 label, as Kubernetes requires of namespace names (and StatefulSet names, whose
// pods append "-<ordinal>").
bool IsDnsLabel(const std::string& s) {
  if (s.empty() || s.size() > 63) return false;
  for (char ch : s) {
    if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-')) return false;
  }
  return s.front() != '-' && s.back() != '-';
}

void ParseSlurmOnKubernetes(const YAML::Node& sok, const Reader& r, BrokerConfig& c) {
  r.CheckKeys(sok, "slurmOnKubernetes", {"namespace", "pools"});
  if (!sok["namespace"]) r.Fail(sok, "slurmOnKubernetes.namespace", "required");
  c.slurm_namespace = r.String(sok["namespace"], "slurmOnKubernetes.namespace");
  if (!IsDnsLabel(c.slurm_namespace)) {
    r.Fail(sok["namespace"], "slurmOnKubernetes.namespace",
           "must be a namespace name (lower-case letters, digits, '-'), got \"" +
               c.slurm_namespace + "\"");
  }
  const YAML::Node pools = sok["pools"];
  if (!pools) r.Fail(sok, "slurmOnKubernetes.pools", "required: the slurmd StatefulSets");
  if (!pools.IsSequence() || pools.size() == 0) {
    r.Fail(pools, "slurmOnKubernetes.pools", "must be a non-empty list");
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < pools.size(); ++i) {
    const std::string f = "slurmOnKubernetes.pools[" + std::to_string(i) + "]";
    const YAML::Node p = pools[i];
    r.CheckKeys(p, f, {"statefulSet", "replicas", "minReplicas", "gpus", "gpuType"});
    ScaledPool pool;
    if (!p["statefulSet"]) r.Fail(p, f + ".statefulSet", "required");
    pool.stateful_set = r.String(p["statefulSet"], f + ".statefulSet");
    if (!IsDnsLabel(pool.stateful_set)) {
      r.Fail(p["statefulSet"], f + ".statefulSet",
             "must be a StatefulSet name (lower-case letters, digits, '-'), got \"" +
                 pool.stateful_set + "\"");
    }
    if (!seen.insert(pool.stateful_set).second) {
      r.Fail(p["statefulSet"], f + ".statefulSet", "\"" + pool.stateful_set + "\" is listed twice");
    }
    if (!p["replicas"]) r.Fail(p, f + ".replicas", "required: the pool's size with nothing lent");
    pool.replicas = r.Int(p["replicas"], f + ".replicas", 1, 10000);
    if (p["minReplicas"]) {
      pool.min_replicas = r.Int(p["minReplicas"], f + ".minReplicas", 0, 10000);
      if (pool.min_replicas > pool.replicas) {
        r.Fail(p["minReplicas"], f + ".minReplicas",
               "must not exceed replicas (" + std::to_string(pool.replicas) + ")");
      }
    }
    if (!p["gpus"]) r.Fail(p, f + ".gpus", "required: the GPUs each pod requests");
    pool.gpus = r.Int(p["gpus"], f + ".gpus", 1, 1024);
    if (p["gpuType"]) {
      pool.gpu_type = r.String(p["gpuType"], f + ".gpuType");
      for (char& ch : pool.gpu_type)
        ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    }
    c.pools.push_back(pool);
  }
  // Two pools whose pod names could collide ("a" ordinal 1-0 vs "a-1" ordinal 0) would make a
  // Slurm node name ambiguous.
  for (const ScaledPool& a : c.pools) {
    for (const ScaledPool& b : c.pools) {
      if (&a != &b && b.stateful_set.rfind(a.stateful_set + "-", 0) == 0) {
        r.Fail(pools, "slurmOnKubernetes.pools",
               "\"" + a.stateful_set + "\" and \"" + b.stateful_set +
                   "\": pod names of one would be pod names of the other");
      }
    }
  }
}

void Parse(const YAML::Node& root, const Reader& r, BrokerConfig& c) {
  r.CheckKeys(root, "",
              {"slurm", "kubernetes", "rules", "journal", "lease", "metrics", "slurmOnKubernetes"});
  const YAML::Node slurm = root["slurm"];
  if (!slurm) r.Fail(root, "slurm", "required");
  r.CheckKeys(slurm, "slurm",
              {"nodes", "minNodes", "idleTime", "reservationLookahead", "scontrol", "sinfo",
               "squeue", "timeout"});
  const YAML::Node sok = root["slurmOnKubernetes"];
  if (sok) {
    ParseSlurmOnKubernetes(sok, r, c);
    for (const char* key : {"nodes", "minNodes"}) {
      if (slurm[key]) {
        r.Fail(slurm[key], std::string("slurm.") + key,
               "not used with slurmOnKubernetes (its pools name the nodes and their floors)");
      }
    }
  } else {
    if (!slurm["nodes"]) r.Fail(slurm, "slurm.nodes", "required: the nodes the broker may lend");
    c.nodes = r.Names(slurm["nodes"], "slurm.nodes");
    if (c.nodes.empty()) r.Fail(slurm["nodes"], "slurm.nodes", "must name at least one node");
  }
  if (slurm["minNodes"]) {
    c.slurm_min_nodes = r.Int(slurm["minNodes"], "slurm.minNodes", 0, 1 << 20);
  }
  if (slurm["idleTime"]) c.idle_time = r.Duration(slurm["idleTime"], "slurm.idleTime", 0);
  if (slurm["reservationLookahead"]) {
    c.reservation_lookahead =
        r.Duration(slurm["reservationLookahead"], "slurm.reservationLookahead", 0);
  }
  for (auto [key, dst] : {std::pair{"scontrol", &c.scontrol}, std::pair{"sinfo", &c.sinfo},
                          std::pair{"squeue", &c.squeue}}) {
    if (slurm[key]) {
      *dst = r.String(slurm[key], std::string("slurm.") + key);
      if (dst->empty()) r.Fail(slurm[key], std::string("slurm.") + key, "must not be empty");
    }
  }
  if (slurm["timeout"]) c.command_timeout = r.Duration(slurm["timeout"], "slurm.timeout", 100);

  const YAML::Node k8s = root["kubernetes"];
  if (!k8s) r.Fail(root, "kubernetes", "required");
  r.CheckKeys(k8s, "kubernetes",
              {"namespaces", "maxNodes", "minNodes", "poolLabel", "taint", "kubeconfig"});
  if (!k8s["namespaces"]) r.Fail(k8s, "kubernetes.namespaces", "required");
  c.namespaces = r.Names(k8s["namespaces"], "kubernetes.namespaces");
  if (c.namespaces.empty()) {
    r.Fail(k8s["namespaces"], "kubernetes.namespaces", "must name at least one namespace");
  }
  if (k8s["maxNodes"]) c.k8s_max_nodes = r.Int(k8s["maxNodes"], "kubernetes.maxNodes", 0, 1 << 20);
  if (k8s["minNodes"]) c.k8s_min_nodes = r.Int(k8s["minNodes"], "kubernetes.minNodes", 0, 1 << 20);
  if (c.k8s_min_nodes > c.k8s_max_nodes) {
    r.Fail(k8s["minNodes"], "kubernetes.minNodes",
           "must not exceed kubernetes.maxNodes (" + std::to_string(c.k8s_max_nodes) + ")");
  }
  if (!c.SlurmOnKubernetes() && c.slurm_min_nodes > static_cast<int>(c.nodes.size())) {
    r.Fail(slurm["minNodes"], "slurm.minNodes",
           "must not exceed the number of slurm.nodes (" + std::to_string(c.nodes.size()) + ")");
  }
  if (k8s["poolLabel"]) {
    const std::string v = r.String(k8s["poolLabel"], "kubernetes.poolLabel");
    if (!SplitPair(v, &c.pool_label_key, &c.pool_label_value)) {
      r.Fail(k8s["poolLabel"], "kubernetes.poolLabel", "must be key=value, got \"" + v + "\"");
    }
  }
  if (k8s["taint"]) {
    const std::string v = r.String(k8s["taint"], "kubernetes.taint");
    const size_t colon = v.rfind(':');
    std::string kv = colon == std::string::npos ? "" : v.substr(0, colon);
    c.taint_effect = colon == std::string::npos ? "" : v.substr(colon + 1);
    if (!SplitPair(kv, &c.taint_key, &c.taint_value) ||
        (c.taint_effect != "NoSchedule" && c.taint_effect != "NoExecute" &&
         c.taint_effect != "PreferNoSchedule")) {
      r.Fail(k8s["taint"], "kubernetes.taint",
             "must be key=value:NoSchedule|PreferNoSchedule|NoExecute, got \"" + v + "\"");
    }
  }
  if (k8s["kubeconfig"]) c.kubeconfig = r.String(k8s["kubeconfig"], "kubernetes.kubeconfig");

  if (const YAML::Node rules = root["rules"]) {
    r.CheckKeys(rules, "rules",
                {"demandEvaluations", "minResidence", "cooldown", "returnAfterIdle",
                 "evictionTimeout", "interval"});
    if (rules["demandEvaluations"]) {
      c.demand_evaluations = r.Int(rules["demandEvaluations"], "rules.demandEvaluations", 1, 1000);
    }
    if (rules["minResidence"]) {
      c.min_residence = r.Duration(rules["minResidence"], "rules.minResidence", 0);
    }
    if (rules["cooldown"]) c.cooldown = r.Duration(rules["cooldown"], "rules.cooldown", 0);
    if (rules["returnAfterIdle"]) {
      c.return_after_idle = r.Duration(rules["returnAfterIdle"], "rules.returnAfterIdle", 0);
    }
    if (rules["evictionTimeout"]) {
      c.eviction_timeout = r.Duration(rules["evictionTimeout"], "rules.evictionTimeout", 1000);
    }
    if (rules["interval"]) c.interval = r.Duration(rules["interval"], "rules.interval", 100);
  }
  if (root["journal"]) {
    c.journal_path = r.String(root["journal"], "journal");
    if (c.journal_path.empty()) r.Fail(root["journal"], "journal", "must not be empty");
  }
  if (const YAML::Node lease = root["lease"]) {
    r.CheckKeys(lease, "lease", {"namespace", "name", "duration"});
    // By default the namespace deploy/broker installs the broker in, where its Role grants the
    // Lease (the API server refuses a Lease anywhere else with that RBAC).
    c.lease_namespace = lease["namespace"] ? r.String(lease["namespace"], "lease.namespace")
                                           : std::string(kDefaultLeaseNamespace);
    if (!lease["name"]) r.Fail(lease, "lease.name", "required");
    c.lease_name = r.String(lease["name"], "lease.name");
    // Three intervals by default: the leader renews every interval, so it renews at least twice
    // before the lease could lapse, and a standby takes over within about three intervals.
    c.lease_duration = 3 * c.interval;
    if (lease["duration"]) c.lease_duration = r.Duration(lease["duration"], "lease.duration", 1000);
    if (c.lease_duration <= 2 * c.interval) {
      r.Fail(lease["duration"] ? lease["duration"] : lease, "lease.duration",
             "must be more than twice rules.interval (" +
                 FormatDuration(std::chrono::milliseconds(c.interval)) + "), got " +
                 FormatDuration(std::chrono::milliseconds(c.lease_duration)) +
                 ": the lease would lapse between renewals and replicas would take turns");
    }
  }
  if (const YAML::Node m = root["metrics"]) {
    r.CheckKeys(m, "metrics", {"address"});
    if (m["address"]) c.metrics_address = r.String(m["address"], "metrics.address");
  }
}

}  // namespace

const ScaledPool* BrokerConfig::PoolOf(const std::string& node, int* ordinal) const {
  for (const ScaledPool& p : pools) {
    const std::string prefix = p.stateful_set + "-";
    if (node.size() <= prefix.size() || node.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = node.substr(prefix.size());
    if (digits.size() > 6 || (digits.size() > 1 && digits[0] == '0')) continue;
    int v = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    if (ec != std::errc() || end != digits.data() + digits.size()) continue;
    if (ordinal != nullptr) *ordinal = v;
    return &p;
  }
  return nullptr;
}

bool BrokerConfig::Manages(const std::string& node) const {
  return std::find(nodes.begin(), nodes.end(), node) != nodes.end();
}

Result<BrokerConfig> ParseBrokerConfig(const std::string& text, const std::string& source) {
  BrokerConfig c;
  try {
    YAML::Node root = YAML::Load(text);
    Parse(root, Reader(source), c);
  } catch (const ConfigError& e) {
    return Status(ErrorCode::kInvalidInput, e.message);
  } catch (const YAML::Exception& e) {
    return Status(ErrorCode::kInvalidInput,
                  source + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  return c;
}

Result<BrokerConfig> LoadBrokerConfig(const std::string& path) {
  Result<std::string> text = ReadFileBounded(path, 1u << 20);
  if (!text.ok()) {
    if (text.status().code() == ErrorCode::kNotFound) {
      return Status(ErrorCode::kNotFound, path + ": cannot read the broker config");
    }
    return text.status();
  }
  return ParseBrokerConfig(*text, path);
}

}  // namespace gpulet::broker
