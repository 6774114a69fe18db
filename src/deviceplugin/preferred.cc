#include "deviceplugin/preferred.h"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

namespace gpulet::deviceplugin {
namespace {

// Closeness of two GPUs over PCIe; higher is closer.
int PcieCloseness(gpu::PcieRelation r) {
  switch (r) {
    case gpu::PcieRelation::kSameBoard:
      return 5;
    case gpu::PcieRelation::kSameSwitch:
      return 4;
    case gpu::PcieRelation::kHostBridge:
      return 3;
    case gpu::PcieRelation::kSameCpu:
      return 2;
    case gpu::PcieRelation::kCrossCpu:
      return 1;
    case gpu::PcieRelation::kUnknown:
      return 0;
  }
  return 0;
}

struct Score {
  long nvlinks = 0;
  long pcie = 0;
  auto operator<=>(const Score&) const = default;
  Score operator+(const Score& o) const { return {nvlinks + o.nvlinks, pcie + o.pcie}; }
};

// Pairwise scores between the candidates (positions into the resource's device list).
class Affinity {
 public:
  Affinity(const sharing::Resource& resource, const gpu::Inventory& inv,
           const std::vector<size_t>& positions)
      : n_(positions.size()), score_(n_ * n_) {
    for (size_t a = 0; a < n_; ++a) {
      for (size_t b = a + 1; b < n_; ++b) {
        unsigned ga = resource.devices[positions[a]].gpu_index;
        unsigned gb = resource.devices[positions[b]].gpu_index;
        Score s;
        // Two IDs on one GPU (replicas, MIG devices) share no link: spreading is preferred.
        if (ga != gb && ga < inv.links.size() && gb < inv.links[ga].size()) {
          const gpu::Link& l = inv.links[ga][gb];
          s = {static_cast<long>(l.nvlinks), PcieCloseness(l.pcie)};
        }
        score_[a * n_ + b] = score_[b * n_ + a] = s;
      }
    }
  }
  const Score& operator()(size_t a, size_t b) const { return score_[a * n_ + b]; }
  Score Of(const std::vector<size_t>& set) const {
    Score total;
    for (size_t i = 0; i < set.size(); ++i) {
      for (size_t j = i + 1; j < set.size(); ++j) total = total + (*this)(set[i], set[j]);
    }
    return total;
  }

 private:
  size_t n_;
  std::vector<Score> score_;
};

// Better: higher score, then lexicographically smaller (sorted) member list.
bool Better(const Score& s, std::vector<size_t> set, const Score& best_s,
            const std::vector<size_t>& best_sorted) {
  if (best_sorted.empty()) return true;
  if (s != best_s) return s > best_s;
  std::sort(set.begin(), set.end());
  return set < best_sorted;
}

uint64_t Combinations(size_t n, size_t k, uint64_t cap) {
  if (k > n) return 0;
  k = std::min(k, n - k);
  uint64_t c = 1;
  for (size_t i = 1; i <= k; ++i) {
    c = c * (n - k + i) / i;
    if (c > cap) return cap + 1;
  }
  return c;
}

constexpr uint64_t kExhaustiveLimit = 5000;

bool IsShared(const sharing::Resource& r) {
  for (const sharing::AdvertisedDevice& d : r.devices) {
    if (d.replica >= 0) return true;
  }
  return false;
}

// Replica choice for shared resources (see the header). `must` and `free` are plan positions.
std::vector<size_t> ChooseReplicas(const sharing::Resource& resource, const std::set<size_t>& must,
                                   const std::set<size_t>& free, size_t want,
                                   ReplicaPolicy policy) {
  struct Group {
    size_t first = 0;           // plan position of its first replica (tie-break)
    int total = 0;              // replicas the resource advertises for this device
    int free_or_mine = 0;       // available to this request (free + must-include)
    int chosen = 0;             // taken by this request so far
    std::vector<size_t> spare;  // free positions not yet chosen, ascending
    size_t next = 0;            // into spare
    int in_use() const { return total - free_or_mine + chosen; }
  };
  // By backing UUID; iteration order does not matter (ties go to Group::first).
  std::unordered_map<std::string, Group> groups;
  groups.reserve(resource.devices.size());
  for (size_t i = 0; i < resource.devices.size(); ++i) {
    auto [it, fresh] = groups.try_emplace(resource.devices[i].uuid);
    if (fresh) it->second.first = i;
    ++it->second.total;
  }
  std::vector<size_t> out;
  for (size_t p : must) {
    Group& g = groups[resource.devices[p].uuid];
    ++g.free_or_mine;
    ++g.chosen;
    out.push_back(p);
  }
  for (size_t p : free) {
    Group& g = groups[resource.devices[p].uuid];
    ++g.free_or_mine;
    g.spare.push_back(p);
  }
  while (out.size() < want) {
    Group* best = nullptr;
    for (auto& [uuid, g] : groups) {
      if (g.next >= g.spare.size()) continue;
      if (!best) {
        best = &g;
        continue;
      }
      const int a = g.in_use(), b = best->in_use();
      const bool better = policy == ReplicaPolicy::kDistributed ? a < b : a > b;
      if (better || (a == b && g.first < best->first)) best = &g;
    }
    if (!best) break;  // cannot happen: the caller checked there are enough
    out.push_back(best->spare[best->next++]);
    ++best->chosen;
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Memory units (see the header). `must` and `free` are plan positions.
Result<std::vector<size_t>> ChooseMemoryUnits(const sharing::Resource& resource,
                                              const std::set<size_t>& must,
                                              const std::set<size_t>& free, size_t want,
                                              config::MemoryPlacement placement) {
  struct Gpu {
    size_t first = 0;           // plan position of its first unit (tie-break)
    std::vector<size_t> mine;   // must-include units
    std::vector<size_t> spare;  // free units, ascending
  };
  std::map<unsigned, Gpu> gpus;  // by GPU index
  auto gpu_of = [&](size_t p) -> Gpu& {
    auto [it, fresh] = gpus.try_emplace(resource.devices[p].gpu_index);
    if (fresh) it->second.first = p;
    return it->second;
  };
  for (size_t p : must) gpu_of(p).mine.push_back(p);
  for (size_t p : free) gpu_of(p).spare.push_back(p);
  std::vector<unsigned> pinned;
  for (const auto& [index, g] : gpus) {
    if (!g.mine.empty()) pinned.push_back(index);
  }
  if (pinned.size() > 1) {
    return Status(ErrorCode::kInvalidInput, "must-include units of " + resource.name +
                                                " are on GPU " + std::to_string(pinned[0]) +
                                                " and GPU " + std::to_string(pinned[1]) +
                                                "; a container's memory units come from one GPU");
  }
  const Gpu* best = nullptr;
  size_t largest = 0;
  unsigned largest_index = 0;
  for (const auto& [index, g] : gpus) {
    const size_t have = g.mine.size() + g.spare.size();
    if (have > largest) {
      largest = have;
      largest_index = index;
    }
    if (!pinned.empty() && index != pinned[0]) continue;
    if (have < want) continue;
    if (best != nullptr) {
      const size_t b = best->mine.size() + best->spare.size();
      const bool better = placement == config::MemoryPlacement::kBestFit ? have < b : have > b;
      if (!better && !(have == b && g.first < best->first)) continue;
    }
    best = &g;
  }
  if (best == nullptr) {
    std::string why =
        !pinned.empty()
            ? "GPU " + std::to_string(pinned[0]) + " (which holds the must-include units) has " +
                  std::to_string(gpus[pinned[0]].mine.size() + gpus[pinned[0]].spare.size())
            : "the largest free block is " + std::to_string(largest) + " on GPU " +
                  std::to_string(largest_index);
    return Status(ErrorCode::kInvalidInput, "no GPU of " + resource.name + " has " +
                                                std::to_string(want) +
                                                " free units for one container (" + why +
                                                "); a container's memory units come from one GPU");
  }
  std::vector<size_t> out = best->mine;
  for (size_t i = 0; out.size() < want && i < best->spare.size(); ++i) {
    out.push_back(best->spare[i]);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

const char* ReplicaPolicyName(ReplicaPolicy p) {
  return p == ReplicaPolicy::kPacked ? "packed" : "distributed";
}

Result<ReplicaPolicy> ParseReplicaPolicy(std::string_view text) {
  if (text == "distributed") return ReplicaPolicy::kDistributed;
  if (text == "packed") return ReplicaPolicy::kPacked;
  return Status(ErrorCode::kInvalidInput,
                "invalid value \"" + std::string(text) + "\" (want distributed|packed)");
}

Result<std::vector<std::string>> PreferredAllocation(const sharing::Resource& resource,
                                                     const gpu::Inventory& inventory,
                                                     const std::vector<std::string>& available,
                                                     const std::vector<std::string>& must_include,
                                                     int size, ReplicaPolicy policy,
                                                     config::MemoryPlacement memory_placement) {
  std::unordered_map<std::string, size_t> position;
  position.reserve(resource.devices.size());
  for (size_t i = 0; i < resource.devices.size(); ++i) position[resource.devices[i].id] = i;

  std::set<size_t> must_set;
  for (const std::string& id : must_include) {
    auto it = position.find(id);
    if (it == position.end()) {
      return Status(ErrorCode::kInvalidInput,
                    "must-include device ID \"" + id + "\" is not a device of " + resource.name);
    }
    if (!must_set.insert(it->second).second) {
      return Status(ErrorCode::kInvalidInput,
                    "must-include device ID \"" + id + "\" is listed twice");
    }
  }
  std::set<size_t> free_set;
  for (const std::string& id : available) {
    auto it = position.find(id);
    if (it == position.end()) continue;  // stale view: not ours to fail on
    if (!must_set.count(it->second)) free_set.insert(it->second);
  }
  if (size < 0 || static_cast<size_t>(size) < must_set.size()) {
    return Status(ErrorCode::kInvalidInput,
                  "allocation size " + std::to_string(size) + " is smaller than the " +
                      std::to_string(must_set.size()) + " must-include devices");
  }
  const size_t want = static_cast<size_t>(size);
  if (must_set.size() + free_set.size() < want) {
    return Status(ErrorCode::kInvalidInput, "allocation size " + std::to_string(size) +
                                                " exceeds the " +
                                                std::to_string(must_set.size() + free_set.size()) +
                                                " available devices of " + resource.name);
  }

  if (resource.sharing == sharing::SharingKind::kMemory) {
    Result<std::vector<size_t>> units =
        ChooseMemoryUnits(resource, must_set, free_set, want, memory_placement);
    if (!units.ok()) return units.status();
    std::vector<std::string> ids;
    for (size_t p : *units) ids.push_back(resource.devices[p].id);
    return ids;
  }

  if (IsShared(resource)) {
    std::vector<std::string> ids;
    for (size_t p : ChooseReplicas(resource, must_set, free_set, want, policy)) {
      ids.push_back(resource.devices[p].id);
    }
    return ids;
  }

  // Local numbering: must-include first, then the free candidates in plan order.
  std::vector<size_t> positions(must_set.begin(), must_set.end());
  const size_t n_must = positions.size();
  positions.insert(positions.end(), free_set.begin(), free_set.end());
  const size_t n = positions.size();
  const size_t k = want - n_must;
  Affinity affinity(resource, inventory, positions);

  std::vector<size_t> base(n_must);
  for (size_t i = 0; i < n_must; ++i) base[i] = i;
  std::vector<size_t> best;  // local indices, sorted
  Score best_score;

  if (k == 0) {
    best = base;
  } else if (Combinations(n - n_must, k, kExhaustiveLimit) <= kExhaustiveLimit) {
    // Lexicographic enumeration of k-subsets of the free candidates.
    std::vector<size_t> pick(k);
    for (size_t i = 0; i < k; ++i) pick[i] = n_must + i;
    while (true) {
      std::vector<size_t> set = base;
      set.insert(set.end(), pick.begin(), pick.end());
      Score s = affinity.Of(set);
      if (Better(s, set, best_score, best)) {
        best_score = s;
        std::sort(set.begin(), set.end());
        best = std::move(set);
      }
      size_t i = k;
      while (i > 0 && pick[i - 1] == n - k + (i - 1)) --i;
      if (i == 0) break;
      ++pick[i - 1];
      for (size_t j = i; j < k; ++j) pick[j] = pick[j - 1] + 1;
    }
  } else {
    // Greedy growth from each free candidate as seed, with incremental gains.
    std::vector<Score> gain(n);
    std::vector<char> in(n);
    for (size_t seed = n_must; seed < n; ++seed) {
      std::fill(gain.begin(), gain.end(), Score{});
      std::fill(in.begin(), in.end(), 0);
      std::vector<size_t> set;
      Score total;
      auto add = [&](size_t m) {
        total = total + gain[m];
        in[m] = 1;
        set.push_back(m);
        for (size_t c = 0; c < n; ++c) {
          if (!in[c]) gain[c] = gain[c] + affinity(c, m);
        }
      };
      for (size_t m : base) add(m);
      add(seed);
      while (set.size() < want) {
        size_t pick = n;
        for (size_t c = n_must; c < n; ++c) {
          if (in[c]) continue;
          if (pick == n || gain[c] > gain[pick]) pick = c;
        }
        add(pick);
      }
      if (Better(total, set, best_score, best)) {
        best_score = total;
        std::sort(set.begin(), set.end());
        best = std::move(set);
      }
    }
  }

  std::vector<size_t> chosen;
  for (size_t local : best) chosen.push_back(positions[local]);
  std::sort(chosen.begin(), chosen.end());
  std::vector<std::string> ids;
  for (size_t p : chosen) ids.push_back(resource.devices[p].id);
  return ids;
}

}  // namespace gpulet::deviceplugin
