// The pieces of the whole-node engine (engine.cc) that the Slurm-on-Kubernetes engine
// (scaled_engine.cc) shares: the Slurm capacity and lend rules, so both modes match GPU types,
// protect pending jobs and reservations the same way. Internal to src/broker.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "broker/config.h"
#include "broker/engine.h"
#include "broker/model.h"

namespace gpulet::broker::detail {

std::string Seconds(TimeMs ms);
std::string FlagsText(const SlurmNode& n);
// A decision carrying journal `j`; kDrain gets the whole-node drain reason (callers may replace
// it).
Decision Make(const Journal& j, Action a, std::string node, std::string code, std::string reason);
// Both modes start alike: an unreadable Slurm or Kubernetes state is a no-action decision
// (fail closed); otherwise nullopt, after counting the demand/quiet streaks into `j`.
std::optional<Decision> FailClosedOrCountStreaks(const SlurmView& slurm, const KubeView& kube,
                                                 Journal& j);
// Both modes gate lending alike: no demand (or not yet for long enough), or `lent` already at
// kubernetes.maxNodes (`unit`: "nodes" or "pods"), is a no-action decision; nullopt otherwise.
std::optional<Decision> LendGate(const Journal& j, const BrokerConfig& c,
                                 const std::string& floor_note, int lent, const char* unit);
// Journals `node` as lent from `now` on: kLending, draining, with the GPUs Slurm had for it.
void StartLending(Journal& j, const std::string& node, int gpus, TimeMs now);
// Up, not drained, with GPUs.
bool SlurmCapacity(const SlurmNode& n);
// The GPUs of type `type` ("" = any) of the nodes Slurm can schedule on, optionally with `plus`.
std::vector<int> SlurmPool(const SlurmView& slurm, const Journal& j, const std::string& plus,
                           const std::string& type);
// "4 GPUs", "4 h100 GPUs".
std::string JobGpus(const SlurmJob& job);
// The capacity-bound pending GPU jobs, largest first; and of those the largest per GPU type.
std::vector<const SlurmJob*> CapacityBoundJobs(const SlurmView& slurm);
std::vector<const SlurmJob*> LargestPerType(const std::vector<const SlurmJob*>& bound);

// What the lend rules need from all jobs and nodes, computed once per evaluation (the rules
// then cost O(1) per candidate: 1,000 nodes x 10,000 jobs stays cheap).
struct TypePool {
  const SlurmJob* largest = nullptr;  // the largest capacity-bound job of this GPU type
  int pool_total = 0;                 // GPUs of that type in Slurm's schedulable pool
  int pool_fit = 0;                   // nodes in it with >= largest->gpus_per_node of them
};
struct LendContext {
  std::map<std::string, std::string> named;  // node → a pending job naming it
  std::vector<TypePool> types;
};
LendContext MakeLendContext(const SlurmView& slurm, const Journal& j,
                            const std::vector<const SlurmJob*>& largest_per_type);
// The largest capacity-bound job that would no longer fit without `n`, or nullptr.
const SlurmJob* NeededBy(const LendContext& ctx, const SlurmNode& n);
// Why Slurm node `name` may not be lent now ("" when it may). `need_kube_node`: the whole-node
// mode also needs a Kubernetes Node of that name.
std::string LendBlocker(const std::string& name, const SlurmView& slurm, const KubeView& kube,
                        const Journal& j, const BrokerConfig& c, TimeMs now, const LendContext& ctx,
                        bool need_kube_node);

}  // namespace gpulet::broker::detail
