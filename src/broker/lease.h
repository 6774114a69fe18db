// Leader election for broker replicas on a coordination.k8s.io/v1 Lease, as client-go does it:
// a standby never compares the holder's renewTime (another host's wall clock) with its own
// clock. It remembers when, on ITS monotonic clock, it first saw the current lease record
// (resourceVersion, holder, renewTime) and takes over only once that record has stayed unchanged
// for the lease's leaseDurationSeconds. The holder counts its own lease from the moment it sent
// the renewal, so it stops acting before any standby can have taken over.
//
// Writes carry the resourceVersion read, so two replicas racing for the lease cannot both win
// (the loser gets HTTP 409). Taking the lease from another holder increments leaseTransitions.
//
// Not thread-safe: one broker loop drives one elector.
#pragma once

#include <cstdint>
#include <string>

#include "broker/config.h"
#include "common/clock.h"
#include "common/status.h"
#include "k8s/client.h"

namespace gpulet::broker {

class LeaseElector {
 public:
  LeaseElector(const k8s::Client& client, const BrokerConfig& config, std::string identity,
               Clock& clock);

  // One round: creates the Lease, renews ours, or takes over one whose record has not changed
  // for its duration as measured here. true: this replica holds the lease (until held_until()).
  // An API error leaves the lease as it was and is returned (the caller acts on nothing).
  Result<bool> TryAcquireOrRenew();

  // Whether the lease is ours for at least `margin` more on our clock.
  bool HeldFor(Clock::Duration margin) const;
  // How many times this replica has taken the lease (created it or taken it over). A new term
  // means another replica may have acted in between: shared state must be read again.
  uint64_t terms() const { return terms_; }
  const std::string& identity() const { return identity_; }

 private:
  const k8s::Client& client_;
  const BrokerConfig& config_;
  std::string identity_;
  Clock& clock_;
  std::string observed_record_;   // the record last read, as one comparable string
  Clock::TimePoint observed_at_;  // when (our clock) that record was first seen
  Clock::TimePoint held_until_;   // ours until then (our clock); past when not held
  uint64_t terms_ = 0;
  bool holding_ = false;  // our last successful write made us the holder (and nobody since)
};

}  // namespace gpulet::broker
