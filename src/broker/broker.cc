#include "broker/broker.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "broker/journal.h"
#include "broker/scaled_engine.h"
#include "metrics/http_server.h"

namespace gpulet::broker {
namespace {

std::string Age(TimeMs ms) {
  const TimeMs s = ms / 1000;
  if (s < 120) return std::to_string(s) + "s";
  if (s < 7200) return std::to_string(s / 60) + "m";
  return std::to_string(s / 3600) + "h" + std::to_string((s % 3600) / 60) + "m";
}

std::string Escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '"' || c == '\\') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

bool IsTransition(Action a) {
  return a == Action::kDrain || a == Action::kAdmit || a == Action::kCancelLend ||
         a == Action::kStartReturn || a == Action::kResume || a == Action::kAbortReturn ||
         a == Action::kRelease || a == Action::kScaleDown || a == Action::kScaleUp;
}

}  // namespace

TimeMs NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void BrokerMetrics::Record(const Decision& d, const Journal& j, bool acted_ok, bool dry_run) {
  std::lock_guard<std::mutex> lock(mu_);
  ++decisions_[{ActionName(d.action), d.code}];
  if (acted_ok && !dry_run && IsTransition(d.action)) ++transitions_[ActionName(d.action)];
  pools_.clear();
  for (Owner o : {Owner::kLending, Owner::kKubernetes, Owner::kReturning}) pools_[OwnerName(o)] = 0;
  for (const auto& [name, e] : j.nodes) ++pools_[OwnerName(e.owner)];
  nlohmann::json nodes = nlohmann::json::object();
  for (const auto& [name, e] : j.nodes) {
    nodes[name] = {{"owner", OwnerName(e.owner)}, {"step", e.step}, {"since", e.since}};
  }
  last_json_ = nlohmann::json{
      {"action", ActionName(d.action)},
      {"node", d.node},
      {"code", d.code},
      {"reason", d.reason},
      {"dryRun", dry_run},
      {"nodes",
       nodes}}.dump();
}

void BrokerMetrics::CountError(const std::string& side) {
  std::lock_guard<std::mutex> lock(mu_);
  ++errors_[side];
}

void BrokerMetrics::SetLeader(bool leader) {
  std::lock_guard<std::mutex> lock(mu_);
  leader_ = leader;
}

std::string BrokerMetrics::Prometheus() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream o;
  o << "# HELP gpulet_broker_nodes Nodes the broker holds outside Slurm, by owner.\n"
       "# TYPE gpulet_broker_nodes gauge\n";
  for (const auto& [pool, n] : pools_)
    o << "gpulet_broker_nodes{owner=\"" << pool << "\"} " << n << "\n";
  o << "# HELP gpulet_broker_decisions_total Evaluations by action and reason code.\n"
       "# TYPE gpulet_broker_decisions_total counter\n";
  for (const auto& [k, n] : decisions_) {
    o << "gpulet_broker_decisions_total{action=\"" << k.first << "\",reason=\"" << Escape(k.second)
      << "\"} " << n << "\n";
  }
  o << "# HELP gpulet_broker_transitions_total Actions carried out, by action.\n"
       "# TYPE gpulet_broker_transitions_total counter\n";
  for (const auto& [k, n] : transitions_) {
    o << "gpulet_broker_transitions_total{action=\"" << k << "\"} " << n << "\n";
  }
  o << "# HELP gpulet_broker_errors_total Failed reads or actions, by side.\n"
       "# TYPE gpulet_broker_errors_total counter\n";
  for (const auto& [k, n] : errors_)
    o << "gpulet_broker_errors_total{side=\"" << k << "\"} " << n << "\n";
  o << "# HELP gpulet_broker_leader 1 while this broker holds the lease.\n"
       "# TYPE gpulet_broker_leader gauge\n"
    << "gpulet_broker_leader " << (leader_ ? 1 : 0) << "\n";
  return o.str();
}

std::string BrokerMetrics::StatusJson() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_json_.empty() ? "{}" : last_json_;
}

Broker::Broker(const BrokerConfig& config, const SlurmSide& slurm, const KubeSide& kube,
               BrokerOptions options, Clock& clock)
    : config_(config), slurm_(slurm), kube_(kube), options_(std::move(options)), clock_(clock) {
  if (options_.identity.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    options_.identity = std::string(host) + "-" + std::to_string(getpid());
  }
  if (!config_.lease_name.empty()) {
    lease_ = std::make_unique<LeaseElector>(kube_.client(), config_, options_.identity, clock_);
  }
}

Decision Broker::Idle(const std::string& code, const std::string& reason,
                      const std::string& error_side) {
  Decision d;
  d.code = code;
  d.reason = reason;
  d.journal = journal_;
  if (!error_side.empty()) metrics_.CountError(error_side);
  spdlog::info("event=broker_decision action=none node= reason_code={} reason=\"{}\"", d.code,
               Escape(d.reason));
  metrics_.Record(d, journal_, true, options_.dry_run);
  return d;
}

Status Broker::Start() {
  Result<Journal> j = LoadJournal(config_.journal_path);
  if (!j.ok()) return j.status();
  journal_ = *j;
  for (const auto& [name, e] : journal_.nodes) {
    if (e.owner == Owner::kLending || e.owner == Owner::kReturning) {
      spdlog::info("event=broker_resume node={} owner={} step={}", name, OwnerName(e.owner),
                   e.step);
    }
  }
  return {};
}

Decision Broker::Tick(TimeMs now) {
  const std::string lease_name = config_.lease_namespace + "/" + config_.lease_name;
  if (lease_) {
    Result<bool> leader = lease_->TryAcquireOrRenew();
    metrics_.SetLeader(leader.ok() && *leader);
    if (!leader.ok())
      return Idle("lease_error", "lease: " + leader.status().message(), "kubernetes");
    if (!*leader) return Idle("not_leader", "another broker holds lease " + lease_name, "");
    if (lease_->terms() != term_) {
      // A new term: the previous leader may have moved nodes since this replica read the journal.
      Result<Journal> fresh = LoadJournal(config_.journal_path);
      if (!fresh.ok()) return Idle("journal_error", fresh.status().message(), "journal");
      journal_ = *fresh;
      term_ = lease_->terms();
      spdlog::info("event=broker_journal_reloaded term={} nodes={} in_transit={}", term_,
                   journal_.nodes.size(), journal_.InTransit());
    }
  }
  SlurmView slurm = slurm_.Observe(now);
  KubeView kube = kube_.Observe();
  if (!slurm.ok) metrics_.CountError("slurm");
  if (!kube.ok) metrics_.CountError("kubernetes");
  Decision d = config_.SlurmOnKubernetes() ? EvaluateScaled(slurm, kube, journal_, config_, now)
                                           : Evaluate(slurm, kube, journal_, config_, now);
  bool ok = true;
  std::string error;
  if (lease_ && !options_.dry_run &&
      !lease_->HeldFor(std::chrono::milliseconds(config_.lease_duration / 2))) {
    // Observing took half the lease: renew before writing or acting, or stand down.
    Result<bool> still = lease_->TryAcquireOrRenew();
    if (!still.ok() || !*still || lease_->terms() != term_) {
      metrics_.SetLeader(false);
      return Idle("lease_lost", "lease " + lease_name + " not renewed before acting", "");
    }
  }
  if (!options_.dry_run) {
    if (!(d.journal == journal_)) {
      Status saved = SaveJournal(config_.journal_path, d.journal);
      if (!saved.ok()) {
        metrics_.CountError("journal");
        spdlog::error(
            "event=broker_decision action=none node={} reason_code=journal_error "
            "reason=\"{}\"",
            d.node, saved.message());
        return d;
      }
    }
    journal_ = d.journal;
    Status acted = Act(d);
    if (!acted.ok()) {
      ok = false;
      error = acted.message();
      metrics_.CountError(d.action == Action::kDrain || d.action == Action::kResume ||
                                  d.action == Action::kCancelLend
                              ? "slurm"
                              : "kubernetes");
    }
  } else {
    // Only the counters move in a dry run: ownership stays as it is on disk.
    journal_.demand_streak = d.journal.demand_streak;
    journal_.quiet_streak = d.journal.quiet_streak;
  }
  auto log = ok ? spdlog::level::info : spdlog::level::warn;
  spdlog::log(log,
              "event=broker_decision action={} node={} reason_code={} reason=\"{}\" dry_run={}{}",
              ActionName(d.action), d.node, d.code, Escape(d.reason), options_.dry_run,
              ok ? "" : " error=\"" + Escape(error) + "\"");
  metrics_.Record(d, journal_, ok, options_.dry_run);
  return d;
}

Status Broker::Act(const Decision& d) {
  switch (d.action) {
    case Action::kNone:
      return {};
    case Action::kDrain:
      return slurm_.Drain(d.node, d.drain_reason);
    case Action::kCancelLend:
    case Action::kResume: {
      Result<bool> r = slurm_.ResumeIfOurs(
          d.node, config_.SlurmOnKubernetes() ? kScaleDownReasonPrefix : kBrokerReasonPrefix);
      if (!r.ok()) return r.status();
      if (!*r)
        spdlog::info("event=broker_resume_skipped node={} why=\"not drained by us\"", d.node);
      return {};
    }
    case Action::kAdmit:
    case Action::kAbortReturn:
      return kube_.Admit(d.node);
    case Action::kStartReturn:
      return kube_.StartReturn(d.node);
    case Action::kEvict: {
      Result<EvictionResult> r = kube_.Evict(d.evict);
      if (!r.ok()) return r.status();
      spdlog::info("event=broker_evict node={} evicted={} blocked_by_pdb={}", d.node, r->evicted,
                   r->blocked);
      return {};
    }
    case Action::kRelease:
      return {};
    case Action::kScaleDown:
    case Action::kScaleUp:
      return kube_.ScaleStatefulSet(d.stateful_set, d.replicas_from, d.replicas_to);
  }
  return {};
}

void Broker::Run(StopSignal& stop) {
  while (!stop.stopped()) {
    const Clock::TimePoint next = clock_.Now() + std::chrono::milliseconds(config_.interval);
    Tick(clock_.WallMillis());
    if (!clock_.SleepUntil(next, stop)) break;
  }
}

BrokerHttp::BrokerHttp(const BrokerMetrics& metrics)
    : metrics_(metrics), unused_publisher_(std::make_unique<metrics::Publisher>()) {}

BrokerHttp::~BrokerHttp() {
  if (server_) server_->Stop();
}

Status BrokerHttp::Start(const std::string& address) {
  metrics::HttpOptions o;
  o.address = address;
  o.threads = 1;  // no basic auth: the worker only exists for it
  o.routes["/metrics"] = [this] {
    return std::make_pair(std::string("text/plain; version=0.0.4"), metrics_.Prometheus());
  };
  o.routes["/status"] = [this] {
    return std::make_pair(std::string("application/json"), metrics_.StatusJson());
  };
  o.routes["/health"] = [] {
    return std::make_pair(std::string("text/plain"), std::string("OK\n"));
  };
  server_ = std::make_unique<metrics::MetricsServer>(*unused_publisher_, o);
  Status s = server_->Start();
  if (!s.ok()) {
    server_.reset();
    return Status(s.code(), "metrics: " + s.message());
  }
  port_ = server_->port();
  return {};
}

std::string FormatStatus(const Journal& j, const BrokerConfig& c, TimeMs now) {
  std::ostringstream o;
  int slurm = 0, k8s = 0;
  for (const std::string& n : c.nodes) {
    Owner owner = j.OwnerOf(n);
    if (owner == Owner::kSlurm) ++slurm;
    if (owner == Owner::kKubernetes) ++k8s;
  }
  if (c.SlurmOnKubernetes()) {
    o << "slurmd pools: " << c.pools.size() << " lent=" << j.Lent()
      << " in-transit=" << j.InTransit() << " (cap " << c.k8s_max_nodes << " pods)\n";
  } else {
    o << "pools: slurm=" << slurm << " kubernetes=" << k8s << " in-transit=" << j.InTransit()
      << " (managed " << c.nodes.size() << ", cap " << c.k8s_max_nodes << ")\n";
  }
  o << "demand: " << j.demand_streak << " consecutive evaluations (lend at " << c.demand_evaluations
    << ")\n";
  if (j.last_transition > 0) o << "last transition: " << Age(now - j.last_transition) << " ago\n";
  for (const ScaledPool& p : c.pools) {
    o << "pool " << p.stateful_set << ": size " << p.replicas << ", floor " << p.min_replicas
      << ", " << p.gpus << (p.gpu_type.empty() ? "" : " " + p.gpu_type) << " GPUs per pod\n";
  }
  o << "NODE\tOWNER\tSTEP\tAGE\n";
  for (const std::string& n : c.nodes) {
    auto it = j.nodes.find(n);
    if (it == j.nodes.end()) {
      o << n << "\tslurm\t-\t-\n";
      continue;
    }
    const JournalEntry& e = it->second;
    o << n << "\t" << OwnerName(e.owner) << "\t" << (e.step.empty() ? "-" : e.step) << "\t"
      << Age(now - e.since) << "\n";
  }
  for (const auto& [n, e] : j.nodes) {
    if (!c.Manages(n) && c.PoolOf(n, nullptr) == nullptr)
      o << n << "\t" << OwnerName(e.owner) << "\t" << e.step << "\t" << Age(now - e.since)
        << " (not in config)\n";
  }
  return o.str();
}

}  // namespace gpulet::broker
