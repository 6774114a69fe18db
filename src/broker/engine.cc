#include "broker/engine.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include "broker/engine_internal.h"

namespace gpulet::broker {
namespace detail {

std::string Seconds(TimeMs ms) { return std::to_string(ms / 1000) + "s"; }

std::string FlagsText(const SlurmNode& n) {
  std::string s = n.state;
  for (const auto& f : n.flags) s += "+" + f;
  return s;
}

Decision Make(const Journal& j, Action a, std::string node, std::string code, std::string reason) {
  Decision d;
  d.action = a;
  d.node = std::move(node);
  d.code = std::move(code);
  d.reason = std::move(reason);
  d.journal = j;
  if (a == Action::kDrain)
    d.drain_reason = std::string(kBrokerReasonPrefix) + " lent to kubernetes";
  return d;
}

void StartLending(Journal& j, const std::string& node, int gpus, TimeMs now) {
  JournalEntry e;
  e.Enter(Owner::kLending, kStepDraining, now);
  e.gpus = gpus;
  j.nodes[node] = e;
  j.last_transition = now;
}

std::optional<Decision> LendGate(const Journal& j, const BrokerConfig& c,
                                 const std::string& floor_note, int lent, const char* unit) {
  if (j.demand_streak == 0) {
    if (!floor_note.empty()) return Make(j, Action::kNone, "", "k8s_floor", floor_note);
    return Make(j, Action::kNone, "", "no_demand", "no demand");
  }
  if (j.demand_streak < c.demand_evaluations) {
    return Make(j, Action::kNone, "", "demand_building",
                "demand seen " + std::to_string(j.demand_streak) + " of " +
                    std::to_string(c.demand_evaluations) + " evaluations");
  }
  if (lent >= c.k8s_max_nodes) {
    return Make(j, Action::kNone, "", "k8s_cap",
                "demand, but " + std::to_string(lent) + " " + unit + " lent = kubernetes.maxNodes");
  }
  return std::nullopt;
}

std::optional<Decision> FailClosedOrCountStreaks(const SlurmView& slurm, const KubeView& kube,
                                                 Journal& j) {
  if (!slurm.ok) {
    return Make(j, Action::kNone, "", "unknown_slurm",
                "Slurm state unknown (" + slurm.error + "): no action");
  }
  if (!kube.ok) {
    return Make(j, Action::kNone, "", "unknown_kubernetes",
                "Kubernetes state unknown (" + kube.error + "): no action");
  }
  if (kube.unschedulable_gpu_pods > 0) {
    ++j.demand_streak;
    j.quiet_streak = 0;
  } else {
    ++j.quiet_streak;
    j.demand_streak = 0;
  }
  return std::nullopt;
}

// A node that counts as Slurm capacity: owned by Slurm (per the journal), up and not drained.
bool SlurmCapacity(const SlurmNode& n) {
  return n.state != "down" && !n.HasFlag("DRAIN") && !n.HasFlag("NOT_RESPONDING") &&
         !n.HasFlag("DOWN") && n.gpus > 0;
}

// The GPUs of type `type` ("" = any) of the nodes Slurm can schedule on, optionally with `plus`.
std::vector<int> SlurmPool(const SlurmView& slurm, const Journal& j, const std::string& plus,
                           const std::string& type) {
  std::vector<int> gpus;
  for (const auto& [name, n] : slurm.nodes) {
    if (name == plus) {
      gpus.push_back(n.GpusOfType(type));
      continue;
    }
    if (j.OwnerOf(name) != Owner::kSlurm) continue;
    if (SlurmCapacity(n)) gpus.push_back(n.GpusOfType(type));
  }
  return gpus;
}

// "4 GPUs", "4 h100 GPUs".
std::string JobGpus(const SlurmJob& job) {
  return std::to_string(job.TotalGpus()) + (job.gpu_type.empty() ? "" : " " + job.gpu_type) +
         " GPUs";
}

// The capacity-bound pending GPU jobs, largest first.
std::vector<const SlurmJob*> CapacityBoundJobs(const SlurmView& slurm) {
  std::vector<const SlurmJob*> jobs;
  for (const SlurmJob& job : slurm.jobs) {
    if (job.CapacityBound() && job.TotalGpus() > 0) jobs.push_back(&job);
  }
  std::sort(jobs.begin(), jobs.end(), [](const SlurmJob* a, const SlurmJob* b) {
    if (a->TotalGpus() != b->TotalGpus()) return a->TotalGpus() > b->TotalGpus();
    return a->id < b->id;
  });
  return jobs;
}

// Of jobs sorted largest first, the largest of each GPU type (a job that takes any GPU is its
// own kind). Slurm runs a typed job only on GPUs of that type, so each type is its own pool.
std::vector<const SlurmJob*> LargestPerType(const std::vector<const SlurmJob*>& bound) {
  std::vector<const SlurmJob*> out;
  std::set<std::string> seen;
  for (const SlurmJob* job : bound) {
    if (seen.insert(job->gpu_type).second) out.push_back(job);
  }
  return out;
}

LendContext MakeLendContext(const SlurmView& slurm, const Journal& j,
                            const std::vector<const SlurmJob*>& largest_per_type) {
  LendContext ctx;
  for (const SlurmJob& job : slurm.jobs) {
    if (!job.Pending()) continue;
    for (const auto& n : job.required_nodes) ctx.named.emplace(n, job.id);
    for (const auto& n : job.sched_nodes) ctx.named.emplace(n, job.id);
  }
  for (const SlurmJob* job : largest_per_type) {
    TypePool t;
    t.largest = job;
    const int per_node = std::max(job->gpus_per_node, 1);
    for (int g : SlurmPool(slurm, j, "", job->gpu_type)) {
      t.pool_total += g;
      if (g >= per_node) ++t.pool_fit;
    }
    ctx.types.push_back(t);
  }
  return ctx;
}

// The largest capacity-bound job that would no longer fit in Slurm's pool without `n` (only
// jobs of a GPU type `n` has can lose anything), or nullptr.
const SlurmJob* NeededBy(const LendContext& ctx, const SlurmNode& n) {
  for (const TypePool& t : ctx.types) {
    const SlurmJob& job = *t.largest;
    const int mine = SlurmCapacity(n) ? n.GpusOfType(job.gpu_type) : 0;
    if (mine == 0) continue;
    const int total = t.pool_total - mine;
    const int fit = t.pool_fit - (mine >= std::max(job.gpus_per_node, 1) ? 1 : 0);
    if ((job.gpus_per_node > 0 && fit < std::max(job.node_count, 1)) || total < job.TotalGpus()) {
      return &job;
    }
  }
  return nullptr;
}

std::string LendBlocker(const std::string& name, const SlurmView& slurm, const KubeView& kube,
                        const Journal& j, const BrokerConfig& c, TimeMs now, const LendContext& ctx,
                        bool need_kube_node) {
  auto it = slurm.nodes.find(name);
  if (it == slurm.nodes.end()) return "not in sinfo";
  const SlurmNode& n = it->second;
  if (need_kube_node && kube.nodes.count(name) == 0) return "no Kubernetes node of that name";
  // DYNAMIC (22.05) / DYNAMIC_NORM (23.02+) say how the node registered (slurmd -Z), not a state.
  const bool flagged = std::any_of(n.flags.begin(), n.flags.end(), [](const std::string& f) {
    return f != "DYNAMIC" && f != "DYNAMIC_NORM";
  });
  if (n.state != "idle" || flagged) return "not plainly idle (" + FlagsText(n) + ")";
  if (n.alloc_cpus > 0 || n.gpus_used > 0) return "a job holds resources on it";
  if (now - n.last_busy < c.idle_time) {
    return "idle for " + Seconds(now - n.last_busy) + " < " + Seconds(c.idle_time);
  }
  if (auto r = j.returned_at.find(name);
      r != j.returned_at.end() && now - r->second < c.min_residence) {
    return "back in Slurm for " + Seconds(now - r->second) + " < minResidence " +
           Seconds(c.min_residence);
  }
  if (auto named = ctx.named.find(name); named != ctx.named.end()) {
    return "named by pending job " + named->second;
  }
  for (const Reservation& r : slurm.reservations) {
    if (r.nodes.count(name) && r.end > now && r.start <= now + c.reservation_lookahead) {
      return "claimed by reservation " + r.name;
    }
  }
  if (const SlurmJob* job = NeededBy(ctx, n)) {
    return "Slurm needs it for pending job " + job->id + " (" + JobGpus(*job) + ")";
  }
  return "";
}

}  // namespace detail

namespace {
using namespace detail;

Decision CarryLending(const std::string& name, const SlurmNode& n, Journal j, const BrokerConfig& c,
                      TimeMs now) {
  JournalEntry& e = j.nodes[name];
  if (n.HasFlag("DRAIN") && !n.ReasonIsOurs()) {
    j.nodes.erase(name);
    j.last_transition = now;
    return Make(j, Action::kRelease, name, "admin_drain",
                "lend of " + name + " abandoned: drained by someone else (\"" + n.reason +
                    "\"); their drain stays");
  }
  if (j.quiet_streak >= c.demand_evaluations) {
    j.nodes.erase(name);
    j.last_transition = now;
    return Make(j, Action::kCancelLend, name, "demand_gone",
                "lend of " + name + " cancelled: no Unschedulable GPU pods for " +
                    std::to_string(j.quiet_streak) + " evaluations");
  }
  if (!n.HasFlag("DRAIN")) {
    if (n.state != "idle" || n.alloc_cpus > 0) {
      j.nodes.erase(name);
      j.last_transition = now;
      return Make(
          j, Action::kCancelLend, name, "lost_to_job",
          "lend of " + name + " cancelled: a job took it before the drain (" + FlagsText(n) + ")");
    }
    e.step = kStepDraining;
    return Make(j, Action::kDrain, name, "drain_pending",
                "drain of " + name + " not seen yet: re-issued");
  }
  if (n.Drained() && !n.HasFlag("NOT_RESPONDING") && n.state != "down") {
    e.Enter(Owner::kKubernetes, "admitting", now);
    e.last_pod_seen = now;
    if (n.gpus > 0) e.gpus = n.gpus;
    j.last_transition = now;
    return Make(j, Action::kAdmit, name, "drained",
                name + " drained in Slurm (" + FlagsText(n) + "): admitted to Kubernetes");
  }
  return Make(j, Action::kNone, name, "waiting_drain",
              "waiting for " + name + " to drain (" + FlagsText(n) + ")");
}

Decision CarryReturning(const std::string& name, const SlurmNode& n, const KubeNode& k, Journal j,
                        const BrokerConfig& c, TimeMs now) {
  JournalEntry& e = j.nodes[name];
  if (!k.unschedulable || !k.slurm_taint) {
    e.step = kStepCordoned;
    e.step_since = now;
    return Make(j, Action::kStartReturn, name, "cordon_pending",
                "cordon/taint of " + name + " not seen yet: re-issued");
  }
  if (k.non_daemonset_pods > 0) {
    if (e.step == kStepEvicting && now - e.step_since >= c.eviction_timeout) {
      e.Enter(Owner::kKubernetes, "admitting", now);
      e.last_pod_seen = now;
      j.last_transition = now;
      return Make(j, Action::kAbortReturn, name, "eviction_timeout",
                  "return of " + name + " aborted: " + std::to_string(k.non_daemonset_pods) +
                      " pods still there after evicting for " + Seconds(c.eviction_timeout));
    }
    if (e.step != kStepEvicting) {
      e.step = kStepEvicting;
      e.step_since = now;
    }
    Decision d = Make(j, Action::kEvict, name, "evicting",
                      "evicting " + std::to_string(k.non_daemonset_pods) + " pods from " + name);
    d.evict = k.evictable;
    return d;
  }
  if (!n.HasFlag("DRAIN")) {
    j.nodes.erase(name);
    j.returned_at[name] = now;
    j.last_transition = now;
    return Make(j, Action::kRelease, name, "already_resumed",
                name + " is no longer drained in Slurm (" + FlagsText(n) + "): returned");
  }
  if (!n.ReasonIsOurs()) {
    j.nodes.erase(name);
    j.returned_at[name] = now;
    j.last_transition = now;
    return Make(j, Action::kRelease, name, "admin_drain",
                name + " returned without RESUME: drained by someone else (\"" + n.reason +
                    "\"); their drain stays");
  }
  const int want = e.gpus > 0 ? e.gpus : 1;
  if (n.state == "down" || n.HasFlag("NOT_RESPONDING") || n.HasFlag("DOWN") || n.gpus < want) {
    return Make(j, Action::kNone, name, "waiting_slurmd",
                "waiting for slurmd on " + name + " to register " + std::to_string(want) +
                    " GPUs (has " + std::to_string(n.gpus) + ", " + FlagsText(n) + ")");
  }
  j.nodes.erase(name);
  j.returned_at[name] = now;
  j.last_transition = now;
  return Make(j, Action::kResume, name, "returned",
              name + " empty in Kubernetes and registered in Slurm with " + std::to_string(n.gpus) +
                  " GPUs: resumed");
}

}  // namespace

const char* ActionName(Action a) {
  switch (a) {
    case Action::kNone:
      return "none";
    case Action::kDrain:
      return "drain";
    case Action::kCancelLend:
      return "cancel-lend";
    case Action::kAdmit:
      return "admit";
    case Action::kStartReturn:
      return "start-return";
    case Action::kEvict:
      return "evict";
    case Action::kResume:
      return "resume";
    case Action::kAbortReturn:
      return "abort-return";
    case Action::kRelease:
      return "release";
    case Action::kScaleDown:
      return "scale-down";
    case Action::kScaleUp:
      return "scale-up";
  }
  return "?";
}

bool JobFits(const SlurmJob& job, const std::vector<int>& node_gpus) {
  const int per_node = std::max(job.gpus_per_node, 1);
  int nodes = 0, total = 0;
  for (int g : node_gpus) {
    total += g;
    if (g >= per_node) ++nodes;
  }
  if (job.gpus_per_node > 0 && nodes < std::max(job.node_count, 1)) return false;
  return total >= job.TotalGpus();
}

Decision Evaluate(const SlurmView& slurm, const KubeView& kube, const Journal& journal,
                  const BrokerConfig& c, TimeMs now) {
  Journal j = journal;
  if (std::optional<Decision> d = FailClosedOrCountStreaks(slurm, kube, j)) return *d;
  // Bookkeeping that holds whatever the action: pod sightings.
  for (auto& [name, e] : j.nodes) {
    auto k = kube.nodes.find(name);
    if (e.owner == Owner::kKubernetes && k != kube.nodes.end() && k->second.inference_pods > 0) {
      e.last_pod_seen = now;
    }
  }

  // Nodes in transit first; a missing view of one of them is "unknown".
  for (auto& [name, e] : j.nodes) {
    const bool transit = e.owner == Owner::kLending || e.owner == Owner::kReturning ||
                         (e.owner == Owner::kKubernetes && e.step == "admitting");
    if (!transit) continue;
    auto s = slurm.nodes.find(name);
    auto k = kube.nodes.find(name);
    if (s == slurm.nodes.end() || k == kube.nodes.end()) {
      return Make(j, Action::kNone, name, "unknown_node",
                  name + " (" + OwnerName(e.owner) + ") missing from the " +
                      (s == slurm.nodes.end() ? "Slurm" : "Kubernetes") + " view: no action");
    }
    if (e.owner == Owner::kLending) return CarryLending(name, s->second, j, c, now);
    if (e.owner == Owner::kReturning) {
      return CarryReturning(name, s->second, k->second, j, c, now);
    }
    // Admitting: confirmed once Kubernetes shows the node schedulable, labelled, untainted.
    const KubeNode& kn = k->second;
    if (kn.unschedulable || kn.slurm_taint || !kn.pool_label) {
      return Make(j, Action::kAdmit, name, "admit_pending",
                  "admission of " + name + " not seen yet: re-issued");
    }
    e.step = kStepAdmitted;
    e.step_since = now;
  }

  if (const TimeMs since = now - j.last_transition; j.last_transition > 0 && since < c.cooldown) {
    return Make(j, Action::kNone, "", "cooldown",
                "cooldown: last transition " + Seconds(since) + " ago < " + Seconds(c.cooldown));
  }

  const std::vector<const SlurmJob*> largest_per_type = LargestPerType(CapacityBoundJobs(slurm));

  // Returns to Slurm.
  const int lent = j.Lent();
  std::string floor_note;  // a return the Kubernetes floor held back
  if (lent > 0) {
    // The jobs (largest of each GPU type) that do not fit in Slurm's pool as it is.
    std::vector<const SlurmJob*> short_jobs;
    for (const SlurmJob* job : largest_per_type) {
      if (!JobFits(*job, SlurmPool(slurm, j, "", job->gpu_type))) short_jobs.push_back(job);
    }
    std::string pick, why, code;
    TimeMs pick_since = std::numeric_limits<TimeMs>::max();
    bool pick_idle = false;
    for (const auto& [name, e] : j.nodes) {
      if (e.owner != Owner::kKubernetes || e.step != kStepAdmitted) continue;
      if (now - e.since < c.min_residence) continue;
      auto k = kube.nodes.find(name);
      auto s = slurm.nodes.find(name);
      if (k == kube.nodes.end() || s == slurm.nodes.end()) continue;
      const bool idle =
          k->second.inference_pods == 0 && now - e.last_pod_seen >= c.return_after_idle;
      // Needed: a short job fits once this node is back (its GPUs are of the job's type).
      const SlurmJob* needed_by = nullptr;
      for (const SlurmJob* job : short_jobs) {
        if (JobFits(*job, SlurmPool(slurm, j, name, job->gpu_type))) {
          needed_by = job;
          break;
        }
      }
      const bool needed = needed_by != nullptr;
      if (!idle && !needed) continue;
      if (lent <= c.k8s_min_nodes) {
        floor_note = name + " could return but Kubernetes keeps its floor of " +
                     std::to_string(c.k8s_min_nodes) + " lent nodes";
        continue;
      }
      // Idle nodes first, then the longest lent.
      if (pick.empty() || (idle && !pick_idle) || (idle == pick_idle && e.since < pick_since)) {
        pick = name;
        pick_since = e.since;
        pick_idle = idle;
        code = idle ? "k8s_idle" : "slurm_demand";
        why = idle ? name + " had no inference pods for " + Seconds(now - e.last_pod_seen)
                   : "Slurm's pending job " + needed_by->id + " (" + JobGpus(*needed_by) +
                         ") needs " + name;
      }
    }
    if (!pick.empty()) {
      JournalEntry& e = j.nodes[pick];
      e.owner = Owner::kReturning;
      e.step = kStepCordoned;
      e.step_since = now;
      j.last_transition = now;
      return Make(j, Action::kStartReturn, pick, code, why + ": returning it to Slurm");
    }
  }

  // Lends to Kubernetes.
  if (std::optional<Decision> d = LendGate(j, c, floor_note, lent, "nodes")) return *d;
  int slurm_managed = 0;
  for (const std::string& name : c.nodes) {
    if (j.OwnerOf(name) == Owner::kSlurm) ++slurm_managed;
  }
  if (slurm_managed - 1 < c.slurm_min_nodes) {
    return Make(
        j, Action::kNone, "", "slurm_floor",
        "demand, but Slurm keeps its floor of " + std::to_string(c.slurm_min_nodes) + " nodes");
  }
  const LendContext ctx = MakeLendContext(slurm, j, largest_per_type);
  std::string pick, blockers;
  TimeMs pick_busy = 0;
  for (const std::string& name : c.nodes) {
    if (j.OwnerOf(name) != Owner::kSlurm) continue;
    const std::string why = LendBlocker(name, slurm, kube, j, c, now, ctx, true);
    if (!why.empty()) {
      blockers += (blockers.empty() ? "" : "; ") + name + ": " + why;
      continue;
    }
    const TimeMs busy = slurm.nodes.at(name).last_busy;
    if (pick.empty() || busy < pick_busy) {
      pick = name;
      pick_busy = busy;
    }
  }
  if (pick.empty()) {
    return Make(j, Action::kNone, "", "no_candidate",
                "demand, but no node may be lent (" + blockers + ")");
  }
  const SlurmNode& n = slurm.nodes.at(pick);
  StartLending(j, pick, n.gpus, now);
  Decision d = Make(j, Action::kDrain, pick, "k8s_demand",
                    std::to_string(kube.unschedulable_gpu_pods) + " Unschedulable GPU pods for " +
                        std::to_string(j.demand_streak) + " evaluations; " + pick + " idle for " +
                        Seconds(now - n.last_busy) + ": lending it");
  return d;
}

}  // namespace gpulet::broker
