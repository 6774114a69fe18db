#include "broker/scaled_engine.h"

#include <algorithm>
#include <limits>

#include "broker/engine_internal.h"

namespace gpulet::broker {
namespace {

using namespace detail;

bool OurScaleDownDrain(const SlurmNode& n) {
  return n.HasFlag("DRAIN") && n.reason.rfind(kScaleDownReasonPrefix, 0) == 0;
}

// Up and registered with GPUs: a returned pod's node has joined Slurm.
bool Registered(const SlurmNode& n) {
  return n.gpus > 0 && n.state != "down" && n.state != "future" && !n.HasFlag("NOT_RESPONDING") &&
         !n.HasFlag("DOWN");
}

Decision Scale(const Journal& j, Action a, const std::string& node, const ScaledPool& pool,
               int from, int to, std::string code, std::string reason) {
  Decision d = Make(j, a, node, std::move(code), std::move(reason));
  d.stateful_set = pool.stateful_set;
  d.replicas_from = from;
  d.replicas_to = to;
  return d;
}

Decision Drain(const Journal& j, const std::string& node, const ScaledPool& pool, std::string code,
               std::string reason) {
  Decision d = Make(j, Action::kDrain, node, std::move(code), std::move(reason));
  d.drain_reason =
      std::string(kScaleDownReasonPrefix) + " of " + pool.stateful_set + " (lent to kubernetes)";
  d.stateful_set = pool.stateful_set;
  return d;
}

int LentPods(const KubeView& kube, const BrokerConfig& c) {
  int lent = 0;
  for (const ScaledPool& p : c.pools) {
    auto s = kube.stateful_sets.find(p.stateful_set);
    if (s != kube.stateful_sets.end()) lent += std::max(0, p.replicas - s->second.replicas);
  }
  return lent;
}

// A drain the broker asked for, carried forward.
Decision CarryLend(const std::string& name, const ScaledPool& pool, int ordinal, int replicas,
                   const SlurmNode* n, Journal j, const BrokerConfig& c, TimeMs now) {
  JournalEntry& e = j.nodes[name];
  if (replicas <= ordinal) {
    // Someone else already removed the pod: the capacity is Kubernetes' now.
    e.Enter(Owner::kKubernetes, kStepAdmitted, now);
    e.last_pod_seen = now;
    j.last_transition = now;
    return Make(j, Action::kNone, name, "already_scaled",
                pool.stateful_set + " already has " + std::to_string(replicas) +
                    " replicas: " + name + " is gone, counted as lent");
  }
  if (replicas > ordinal + 1) {
    j.nodes.erase(name);
    j.last_transition = now;
    return Make(j, Action::kCancelLend, name, "replicas_changed",
                "lend of " + name + " cancelled: " + pool.stateful_set + " was scaled to " +
                    std::to_string(replicas) + " by someone else, " + name +
                    " is no longer its highest ordinal");
  }
  if (n == nullptr) {
    return Make(j, Action::kNone, name, "unknown_node",
                name + " (" + OwnerName(e.owner) + ") missing from the Slurm view: no action");
  }
  if (n->HasFlag("DRAIN") && !OurScaleDownDrain(*n)) {
    j.nodes.erase(name);
    j.last_transition = now;
    return Make(j, Action::kRelease, name, "admin_drain",
                "lend of " + name + " abandoned: drained by someone else (\"" + n->reason +
                    "\"); their drain stays");
  }
  if (e.owner == Owner::kLending && j.quiet_streak >= c.demand_evaluations) {
    j.nodes.erase(name);
    j.last_transition = now;
    return Make(j, Action::kCancelLend, name, "demand_gone",
                "lend of " + name + " cancelled: no Unschedulable GPU pods for " +
                    std::to_string(j.quiet_streak) + " evaluations");
  }
  if (!n->HasFlag("DRAIN")) {
    if (n->state != "idle" || n->alloc_cpus > 0 || n->gpus_used > 0) {
      j.nodes.erase(name);
      j.last_transition = now;
      return Make(
          j, Action::kCancelLend, name, "lost_to_job",
          "lend of " + name + " cancelled: a job took it before the drain (" + FlagsText(*n) + ")");
    }
    e.owner = Owner::kLending;
    e.step = kStepDraining;
    return Drain(j, name, pool, "drain_pending", "drain of " + name + " not seen yet: re-issued");
  }
  if (n->Drained()) {
    const bool again = e.step == kStepScalingDown;
    if (!again) {
      e.Enter(Owner::kKubernetes, kStepScalingDown, now);
      e.last_pod_seen = now;
      if (n->gpus > 0) e.gpus = n->gpus;
      j.last_transition = now;
    }
    return Scale(j, Action::kScaleDown, name, pool, ordinal + 1, ordinal,
                 again ? "scale_down_pending" : "drained",
                 name + " drained and idle in Slurm (" + FlagsText(*n) + "): " + pool.stateful_set +
                     " " + std::to_string(ordinal + 1) + " → " + std::to_string(ordinal) +
                     " replicas" + (again ? " (re-issued)" : ""));
  }
  // Drained by us but a job still runs or completes there: Slurm lets it finish.
  e.owner = Owner::kLending;
  e.step = kStepDraining;
  return Make(j, Action::kNone, name, "waiting_drain",
              "waiting for " + name + " to drain (" + FlagsText(*n) + ")");
}

Decision CarryReturn(const std::string& name, const ScaledPool& pool, int ordinal, int replicas,
                     const SlurmNode* n, Journal j, const BrokerConfig& c, TimeMs now) {
  JournalEntry& e = j.nodes[name];
  if (replicas < ordinal) {
    j.nodes.erase(name);
    j.last_transition = now;
    return Make(j, Action::kRelease, name, "replicas_changed",
                "return of " + name + " given up: " + pool.stateful_set + " was scaled to " +
                    std::to_string(replicas) + " by someone else");
  }
  if (replicas == ordinal) {
    return Scale(j, Action::kScaleUp, name, pool, ordinal, ordinal + 1, "scale_up_pending",
                 "scale-up of " + pool.stateful_set + " to " + std::to_string(ordinal + 1) +
                     " not seen yet: re-issued");
  }
  if (n != nullptr && Registered(*n)) {
    j.nodes.erase(name);
    j.returned_at[name] = now;
    j.last_transition = now;
    if (OurScaleDownDrain(*n)) {
      return Make(j, Action::kResume, name, "returned",
                  name + " registered in Slurm with " + std::to_string(n->gpus) +
                      " GPUs and still carries our old drain: resumed");
    }
    return Make(j, Action::kRelease, name, "returned",
                name + " registered in Slurm with " + std::to_string(n->gpus) + " GPUs (" +
                    FlagsText(*n) + "): returned");
  }
  if (now - e.step_since >= c.eviction_timeout && replicas == ordinal + 1) {
    // The pod never joined Slurm (no free GPUs in Kubernetes, most likely): it ran no job.
    e.Enter(Owner::kKubernetes, kStepScalingDown, now);
    e.last_pod_seen = now;
    j.last_transition = now;
    return Scale(j, Action::kScaleDown, name, pool, ordinal + 1, ordinal, "return_timeout",
                 "return of " + name + " aborted: not registered in Slurm after " +
                     Seconds(c.eviction_timeout) + "; " + pool.stateful_set + " back to " +
                     std::to_string(ordinal) + " replicas");
  }
  return Make(j, Action::kNone, name, "waiting_slurmd",
              "waiting for " + name + " to register in Slurm" +
                  (n == nullptr ? " (not in sinfo yet)" : " (" + FlagsText(*n) + ")"));
}

}  // namespace

std::string PodNodeName(const std::string& stateful_set, int ordinal) {
  return stateful_set + "-" + std::to_string(ordinal);
}

Decision EvaluateScaled(const SlurmView& slurm, const KubeView& kube, const Journal& journal,
                        const BrokerConfig& c, TimeMs now) {
  Journal j = journal;
  if (std::optional<Decision> d = FailClosedOrCountStreaks(slurm, kube, j)) return *d;
  for (auto& [name, e] : j.nodes) {
    if (e.owner == Owner::kKubernetes && kube.inference_gpu_pods > 0) e.last_pod_seen = now;
  }
  auto node_of = [&](const std::string& name) -> const SlurmNode* {
    auto it = slurm.nodes.find(name);
    return it == slurm.nodes.end() ? nullptr : &it->second;
  };

  // Transitions in flight first, and bookkeeping of lent pods that exist again.
  for (auto it = j.nodes.begin(); it != j.nodes.end();) {
    const std::string name = it->first;
    const JournalEntry& e = it->second;
    int ordinal = 0;
    const ScaledPool* pool = c.PoolOf(name, &ordinal);
    if (pool == nullptr) {
      ++it;
      continue;  // not ours in this configuration: reported by `gpulet broker status`
    }
    auto sts = kube.stateful_sets.find(pool->stateful_set);
    if (sts == kube.stateful_sets.end()) {
      return Make(j, Action::kNone, name, "unknown_statefulset",
                  "statefulset " + c.slurm_namespace + "/" + pool->stateful_set + " of " + name +
                      " missing from the Kubernetes view: no action");
    }
    const int replicas = sts->second.replicas;
    if (e.owner == Owner::kLending ||
        (e.owner == Owner::kKubernetes && e.step == kStepScalingDown)) {
      if (e.owner == Owner::kKubernetes && replicas <= ordinal) {
        it->second.step = kStepAdmitted;  // the scale-down took effect
        it->second.step_since = now;
        ++it;
        continue;
      }
      return CarryLend(name, *pool, ordinal, replicas, node_of(name), j, c, now);
    }
    if (e.owner == Owner::kReturning) {
      return CarryReturn(name, *pool, ordinal, replicas, node_of(name), j, c, now);
    }
    if (e.owner == Owner::kKubernetes && replicas > ordinal) {
      // Lent, but the pod exists again (scaled up by someone else): Slurm's once more.
      it = j.nodes.erase(it);
      continue;
    }
    ++it;
  }

  if (const TimeMs since = now - j.last_transition; j.last_transition > 0 && since < c.cooldown) {
    return Make(j, Action::kNone, "", "cooldown",
                "cooldown: last transition " + Seconds(since) + " ago < " + Seconds(c.cooldown));
  }

  const std::vector<const SlurmJob*> largest_per_type = LargestPerType(CapacityBoundJobs(slurm));
  const int lent = LentPods(kube, c);

  // Returns to Slurm: scale a pool up by one.
  std::string floor_note;
  if (lent > 0) {
    std::string why, code;
    const ScaledPool* pick = nullptr;
    int pick_replicas = 0;
    TimeMs pick_since = std::numeric_limits<TimeMs>::max();
    bool pick_idle = false;
    for (const ScaledPool& pool : c.pools) {
      auto sts = kube.stateful_sets.find(pool.stateful_set);
      if (sts == kube.stateful_sets.end() || sts->second.replicas >= pool.replicas) continue;
      const int r = sts->second.replicas;
      const std::string name = PodNodeName(pool.stateful_set, r);
      auto e = j.nodes.find(name);
      TimeMs since = 0, last_pod = 0;  // lent by hand: no record, no residence to wait for
      if (e != j.nodes.end()) {
        if (e->second.owner != Owner::kKubernetes || e->second.step != kStepAdmitted) continue;
        since = e->second.since;
        last_pod = e->second.last_pod_seen;
      }
      if (now - since < c.min_residence) continue;
      const bool idle = kube.inference_gpu_pods == 0 && now - last_pod >= c.return_after_idle;
      const SlurmJob* needed_by = nullptr;
      for (const SlurmJob* job : largest_per_type) {
        if (!job->gpu_type.empty() && job->gpu_type != pool.gpu_type) continue;
        std::vector<int> gpus = SlurmPool(slurm, j, "", job->gpu_type);
        if (JobFits(*job, gpus)) continue;  // not short
        gpus.push_back(pool.gpus);
        if (JobFits(*job, gpus)) {
          needed_by = job;
          break;
        }
      }
      if (!idle && needed_by == nullptr) continue;
      if (lent <= c.k8s_min_nodes) {
        floor_note = pool.stateful_set + " could grow but Kubernetes keeps its floor of " +
                     std::to_string(c.k8s_min_nodes) + " lent pods";
        continue;
      }
      if (pick == nullptr || (idle && !pick_idle) || (idle == pick_idle && since < pick_since)) {
        pick = &pool;
        pick_replicas = r;
        pick_since = since;
        pick_idle = idle;
        code = idle ? "k8s_idle" : "slurm_demand";
        why = idle ? "no GPU pods in the inference namespaces for " + Seconds(now - last_pod)
                   : "Slurm's pending job " + needed_by->id + " (" + JobGpus(*needed_by) +
                         ") needs " + std::to_string(pool.gpus) + " more " +
                         (pool.gpu_type.empty() ? "" : pool.gpu_type + " ") + "GPUs";
      }
    }
    if (pick != nullptr) {
      const std::string name = PodNodeName(pick->stateful_set, pick_replicas);
      JournalEntry& e = j.nodes[name];
      e.Enter(Owner::kReturning, kStepScalingUp, now);
      e.gpus = pick->gpus;
      j.last_transition = now;
      return Scale(j, Action::kScaleUp, name, *pick, pick_replicas, pick_replicas + 1, code,
                   why + ": " + pick->stateful_set + " " + std::to_string(pick_replicas) + " → " +
                       std::to_string(pick_replicas + 1) + " replicas");
    }
  }

  // Lends to Kubernetes: drain the highest ordinal of a pool.
  if (std::optional<Decision> d = LendGate(j, c, floor_note, lent, "pods")) return *d;
  const LendContext ctx = MakeLendContext(slurm, j, largest_per_type);
  const ScaledPool* pick = nullptr;
  std::string pick_name, blockers;
  TimeMs pick_busy = 0;
  for (const ScaledPool& pool : c.pools) {
    auto sts = kube.stateful_sets.find(pool.stateful_set);
    std::string why;
    std::string name;
    if (sts == kube.stateful_sets.end()) {
      why = "statefulset not found";
    } else if (sts->second.replicas <= pool.min_replicas) {
      why = "at its floor of " + std::to_string(pool.min_replicas) + " replicas";
    } else if (sts->second.replicas > pool.replicas) {
      why = "has " + std::to_string(sts->second.replicas) + " replicas, more than its size " +
            std::to_string(pool.replicas) + " in the config";
    } else {
      name = PodNodeName(pool.stateful_set, sts->second.replicas - 1);
      why = j.OwnerOf(name) != Owner::kSlurm
                ? "its highest ordinal " + name + " is " + OwnerName(j.OwnerOf(name))
                : LendBlocker(name, slurm, kube, j, c, now, ctx, false);
      if (!why.empty()) why = name + ": " + why;
    }
    if (!why.empty()) {
      blockers += (blockers.empty() ? "" : "; ") + pool.stateful_set + ": " + why;
      continue;
    }
    const TimeMs busy = slurm.nodes.at(name).last_busy;
    if (pick == nullptr || busy < pick_busy) {
      pick = &pool;
      pick_name = name;
      pick_busy = busy;
    }
  }
  if (pick == nullptr) {
    return Make(j, Action::kNone, "", "no_candidate",
                "demand, but no pool may shrink (" + blockers + ")");
  }
  const SlurmNode& n = slurm.nodes.at(pick_name);
  StartLending(j, pick_name, n.gpus, now);
  return Drain(j, pick_name, *pick, "k8s_demand",
               std::to_string(kube.unschedulable_gpu_pods) + " Unschedulable GPU pods for " +
                   std::to_string(j.demand_streak) + " evaluations; " + pick_name +
                   " (highest ordinal of " + pick->stateful_set + ") idle for " +
                   Seconds(now - n.last_busy) + ": draining it to scale down");
}

}  // namespace gpulet::broker
