// SlicePublisher: keeps the API server holding exactly this node's current ResourceSlices
// (slices.h) for driver gpu.gpulet.io, and nothing else of ours for this node.
//
// Inputs (thread-safe, any thread): SetDevices (inventory and MIG geometry, at start and after a
// rescan), SetHealth (a gpu::HealthSnapshot; FollowHealth(board) feeds it from the node's health
// board), SetGpuUsage (for the placement order). Each change marks the state dirty and wakes the
// publisher thread.
//
// One reconcile pass (the publisher thread runs one when dirty, after a watch event, after a
// failure's backoff and at least every `resync`):
//   1. LIST resourceslices with fieldSelector spec.nodeName=<node>,spec.driver=gpu.gpulet.io.
//   2. When those are exactly the desired slices at one generation (same names, same content but
//      the generation, or the resourceVersions this publisher's own writes produced), done.
//   3. Otherwise generation = max(every generation seen, the last one written) + 1 (so it only
//      ever rises, also across restarts), then each desired slice is created (POST) or replaced
//      (JSON patch of /spec), and slices of ours not desired any more are deleted.
// A failed request ends the pass: the next pass re-lists and starts again, after a backoff that
// doubles from initial_backoff to max_backoff and resets once a pass succeeds (a 429 is retried
// the same way: the client does not hand back Retry-After). A write whose answer was lost is
// found by the next LIST.
//
// Wipes: a watch on the same selector wakes the publisher on a DELETED of a slice it wrote or a
// version whose spec it did not write (the kubelet deletes a node's slices when it starts and a driver's
// 30 s after it deregisters), so they are back within one pass. The watch restarts (without a
// resourceVersion: its first events are the current slices) when its stream ends.
//
// The Node's uid (for the owner reference) is read at the first pass that needs it; until it can
// be read, nothing is published (a slice owned by no Node would never be garbage-collected).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "dra/slices.h"
#include "gpu/health.h"
#include "gpu/inventory.h"
#include "k8s/client.h"
#include "mig/plan.h"

namespace gpulet::dra {

struct PublisherOptions {
  // node_name, memory unit, placement policy, sysfs root; node_uid is read from the API server
  // when left empty.
  SliceOptions slices;
  std::chrono::milliseconds initial_backoff{100};
  std::chrono::milliseconds max_backoff{10000};
  std::chrono::milliseconds resync{30000};  // a full pass at least this often
  int watch_timeout_seconds = 300;          // asked of the server per watch request
};

struct PublisherStats {
  uint64_t passes = 0;          // reconcile passes run
  uint64_t publications = 0;    // passes that wrote a new generation
  uint64_t writes = 0;          // POST/PATCH/DELETE that succeeded
  uint64_t failed_requests = 0; // requests (LIST, writes, Node GET) that failed
  uint64_t wipes_seen = 0;      // watch events that showed a slice of ours deleted or changed
  int64_t generation = 0;       // the generation of the slices last written in full
  uint64_t published_input = 0; // the input version the API server holds (see input_version)
};

class SlicePublisher {
 public:
  // `client` must outlive the publisher.
  SlicePublisher(const k8s::Client& client, PublisherOptions options);
  ~SlicePublisher();  // Stop()s
  SlicePublisher(const SlicePublisher&) = delete;
  SlicePublisher& operator=(const SlicePublisher&) = delete;

  // Inputs; each bumps input_version() when it changes what would be published.
  void SetDevices(std::shared_ptr<const gpu::Inventory> inventory, std::vector<mig::GpuState> mig);
  void SetHealth(const gpu::HealthSnapshot& health);
  void SetGpuUsage(std::vector<int32_t> used_milli);

  // Starts the publisher thread and the slice watch. Errors: kInvalidInput for options that
  // BuildSlices refuses (empty node name, unknown policy, unit <= 0).
  Status Start();
  // Also follows `board` (must outlive the publisher): every new snapshot goes to SetHealth.
  void FollowHealth(const gpu::HealthBoard& board);
  void Stop();

  // One reconcile pass on the caller's thread (tests and `--once`): OK when the API server holds
  // the desired slices afterwards, else the failed request's Status.
  Status PublishOnce();

  // A counter of input changes, and a wait until the API server holds a state at least that new
  // (true) or `timeout` passes (false).
  uint64_t input_version() const;
  bool WaitPublished(uint64_t version, std::chrono::milliseconds timeout) const;

  PublisherStats stats() const;
  // The slices the last pass wanted (for `gpulet dra --print-slices` and tests).
  std::vector<nlohmann::json> desired() const;

 private:
  struct Desired;
  Status Pass();
  void Run();
  void WatchLoop();
  void MarkDirty();

  const k8s::Client& client_;
  PublisherOptions options_;

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  // Inputs.
  std::shared_ptr<const gpu::Inventory> inventory_;
  std::vector<mig::GpuState> mig_;
  std::map<std::string, GpuTaint> taints_;
  std::vector<int32_t> used_milli_;
  uint64_t input_version_ = 0;
  bool dirty_ = true;
  // What the API server holds from us, as far as we know.
  std::string node_uid_;
  int64_t generation_ = 0;
  // Slice name → a digest (SpecDigest) of the spec this publisher last wrote (or is writing): a
  // watch event whose spec has it is our own write's echo; any other content, or a DELETED of one
  // of these, is someone else's. A digest, not the text: 16 GPUs' specs are hundreds of KiB, held
  // for the agent's life.
  std::map<std::string, uint64_t> expected_;
  // The slices last published, as text (a JSON tree holds several times the memory of its text).
  std::vector<std::string> desired_;
  PublisherStats stats_;
  std::optional<std::chrono::steady_clock::time_point> retry_at_;
  std::chrono::seconds retry_after_{0};  // the largest Retry-After of the failed pass

  std::mutex pass_mu_;  // one pass at a time (thread and PublishOnce)
  std::atomic<bool> stop_{false};
  std::atomic<bool> watch_stop_{false};
  std::thread thread_;
  std::thread watch_thread_;
  std::thread health_thread_;
};

}  // namespace gpulet::dra
