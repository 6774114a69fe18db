// The broker's loop: observe both sides, evaluate, persist the journal (intent first), act, log
// one structured line per decision, count it in the metrics. One Tick is one evaluation; Run
// starts one every `rules.interval` (on the injected clock) until stopped.
//
// Lease (lease.h): when the config names one, a Tick that does not hold it observes nothing and
// acts on nothing ("not_leader"). A Tick that starts a new term (this replica just took the lease)
// first reads the journal file again: the previous leader wrote it since this replica last did,
// and acting on the old copy would undo its transitions. Before it writes or acts, a Tick that
// has used up half the lease on observing renews it again, so the leader always acts well inside
// its lease. Dry run: decisions are logged and counted, nothing is drained, patched, evicted or
// written to the journal file.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "broker/config.h"
#include "broker/engine.h"
#include "broker/k8s_side.h"
#include "broker/lease.h"
#include "broker/slurm_side.h"
#include "common/clock.h"

namespace gpulet::metrics {
class MetricsServer;
class Publisher;
}  // namespace gpulet::metrics

namespace gpulet::broker {

struct BrokerOptions {
  bool dry_run = false;
  std::string identity;  // lease holder identity (hostname + pid by default)
};

// The metrics and status, rendered for /metrics and /status.
class BrokerMetrics {
 public:
  void Record(const Decision& d, const Journal& j, bool acted_ok, bool dry_run);
  void CountError(const std::string& side);
  void SetLeader(bool leader);
  std::string Prometheus() const;
  std::string StatusJson() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, std::string>, uint64_t> decisions_;  // (action, code)
  std::map<std::string, uint64_t> transitions_;                        // action
  std::map<std::string, uint64_t> errors_;                             // side
  std::map<std::string, int> pools_;                                   // owner → nodes
  bool leader_ = false;
  std::string last_json_;
};

class Broker {
 public:
  Broker(const BrokerConfig& config, const SlurmSide& slurm, const KubeSide& kube,
         BrokerOptions options, Clock& clock = RealClock());

  // Loads the journal (a corrupt one is an error: the broker must not forget a transition).
  Status Start();
  Decision Tick(TimeMs now);
  // Ticks every interval (measured from the start of each tick) until `stop`.
  void Run(StopSignal& stop);

  const Journal& journal() const { return journal_; }
  const BrokerMetrics& metrics() const { return metrics_; }

 private:
  Status Act(const Decision& d);
  // A decision that acts on nothing, logged and counted.
  Decision Idle(const std::string& code, const std::string& reason, const std::string& error_side);

  const BrokerConfig& config_;
  const SlurmSide& slurm_;
  const KubeSide& kube_;
  BrokerOptions options_;
  Clock& clock_;
  std::unique_ptr<LeaseElector> lease_;  // null without a lease
  uint64_t term_ = 0;                    // the lease term the journal was last read in
  Journal journal_;
  BrokerMetrics metrics_;
};

// /metrics (Prometheus text), /status (JSON) and /health on `address` ("[host]:port", port 0 =
// any), served by the exporter's bounded HTTP server (metrics/http_server.h): idle or slow
// clients cannot take the broker's endpoint down.
class BrokerHttp {
 public:
  explicit BrokerHttp(const BrokerMetrics& metrics);
  ~BrokerHttp();
  Status Start(const std::string& address);
  int port() const { return port_; }

 private:
  const BrokerMetrics& metrics_;
  std::unique_ptr<metrics::Publisher> unused_publisher_;  // the server's own /metrics is replaced
  std::unique_ptr<metrics::MetricsServer> server_;
  int port_ = 0;
};

// `gpulet broker status`: the pools and every node in transit with its age, from a journal.
std::string FormatStatus(const Journal& journal, const BrokerConfig& config, TimeMs now);

TimeMs NowMs();

}  // namespace gpulet::broker
