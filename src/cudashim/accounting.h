// The interposer's accounting, apart from the driver: what this process charges to the region
// (Account) and the records that say what each charge is for (Charge, and the record rules
// below). Header-only and libc-only, like region.h: the library is one translation unit (shim.cc,
// see driver_table.h) and its tests (accounting_test.cc) run it against a real region without a
// driver.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

#include "cudashim/cuda_api.h"
#include "cudashim/region.h"

namespace gpulet::cudashim {

// One charge held against a GPU slot of the region.
struct Charge {
  int gpu = -1;  // the region's GPU slot; -1: nothing charged
  uint64_t bytes = 0;
  CUmemoryPool pool = nullptr;  // allocations from a stream-ordered pool (charged to the pool)
  uint64_t dying = 0;           // a block of a pool destroyed while it was out
};

// This process's side of the region: its slot (`proc`, -1 until attached) and what it charges
// and gives back on each GPU slot. A slot < 0 or 0 bytes is nothing to do.
class Account {
 public:
  Account(Region& region, const std::atomic<int>& proc) : region_(region), proc_(proc) {}

  // Gives `bytes` back on `slot`.
  void Uncharge(int slot, uint64_t bytes) const {
    if (slot >= 0 && bytes != 0) region_.Release(proc_.load(), slot, bytes);
  }
  // Charges a size the driver decided after the call (pitch, array layout, pool rounding), past
  // the limit if need be: the memory exists.
  void ChargeAfter(int slot, uint64_t bytes) const {
    if (slot >= 0 && bytes != 0) region_.Admit(proc_.load(), slot, bytes, /*force=*/true);
  }
  // Moves a recorded charge from `from` to `to` bytes.
  void Recharge(int slot, uint64_t from, uint64_t to) const {
    if (to > from) ChargeAfter(slot, to - from);
    if (to < from) Uncharge(slot, from - to);
  }

 private:
  Region& region_;
  const std::atomic<int>& proc_;
};

// ---- records ------------------------------------------------------------------------------------
//
// The driver hands a freed address (handle, array, module, context, pool) out again at once, to
// any thread. So a release takes its record out *before* calling the driver (TakeRecord) and puts
// it back if the driver refuses (PutBack), and a new record never overwrites another: whatever was
// recorded under the same key is uncharged first (RecordLocked). Another thread's allocation of
// the same address then can never be erased by this thread's release. `mu` guards every map.

// Takes the record of `key` out of `m`; false when there is none.
template <typename Map, typename Key>
bool TakeRecord(std::mutex& mu, Map& m, const Key& key, typename Map::mapped_type* out) {
  std::lock_guard lock(mu);
  auto it = m.find(key);
  if (it == m.end()) return false;
  *out = it->second;
  m.erase(it);
  return true;
}

// Puts a record back after the driver refused its release (the key was not freed, so nobody can
// have taken it meanwhile; if somebody did, the newer record stays and this one is uncharged).
template <typename Map, typename Key>
void PutBack(std::mutex& mu, const Account& account, Map& m, const Key& key, const Charge& c) {
  std::lock_guard lock(mu);
  if (!m.emplace(key, c).second) account.Uncharge(c.gpu, c.bytes);
}

// Records `c` under `key` (caller holds `mu`); a stale record under the same key (a release we
// never saw) is uncharged, never silently overwritten. A pool block's bytes are its pool's
// charge, not its own: nothing to uncharge for it.
template <typename Map, typename Key>
void RecordLocked(const Account& account, Map& m, const Key& key, const Charge& c) {
  auto [it, fresh] = m.try_emplace(key, c);
  if (!fresh) {
    if (it->second.pool == nullptr) account.Uncharge(it->second.gpu, it->second.bytes);
    it->second = c;
  }
}

}  // namespace gpulet::cudashim
