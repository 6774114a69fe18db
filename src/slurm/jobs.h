// Which Slurm job holds which GPU of this node, for the exporter's `hpc_job` label (the name
// dcgm-exporter uses).
//
// Source: `scontrol show job -d -o`, whose per-node detail names the GRES indexes a job holds:
//   "... JobState=RUNNING ... Nodes=n2 CPU_IDs=1 Mem=100 GRES=gpu:h100:3(IDX:0-2) ..."
//   "GRES=gpu(IDX:0,2-3)", "GRES=shard:3(IDX:0)", "GRES=mps:50(IDX:1)".
// IDX counts the node's gpu records in gres.conf order, which for a gres.conf written by
// `gpulet slurm gres` is the order of GresGpuIndexes() below (whole GPUs and MIG devices by GPU
// index); shard and mps records follow the same GPU order.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "slurm/gres.h"
#include "slurm/scontrol.h"

namespace gpulet::slurm {

// GPU index → job ids holding it (ascending, comma-joined: "12" or "12,15" when shards/MPS let
// several jobs share it). Only RUNNING, SUSPENDED and COMPLETING jobs count.
using JobsByGpuMap = std::map<unsigned, std::string>;

// Parses `scontrol show job -d -o` output for node `node_name`. `gpu_of_index[i]` is the GPU
// index behind gres index i of each name ("gpu", "shard", "mps"); an index outside it maps to
// itself. Errors (kInvalidInput) quote the GRES item that could not be read.
Result<JobsByGpuMap> ParseJobGpus(const std::string& text, const std::string& node_name,
                                  const std::map<std::string, std::vector<unsigned>>& gpu_of_index);

// gres index → GPU index per GRES name, from the records gpulet generates.
std::map<std::string, std::vector<unsigned>> GresGpuIndexes(const gpu::Inventory& inventory,
                                                            const NodeGres& gres);

struct JobMapperOptions {
  std::string node_name;  // the Slurm node name of this host
  std::chrono::milliseconds refresh{std::chrono::seconds(10)};
  std::string scontrol = "scontrol";
};

// Keeps JobsByGpu() fresh on a timer. Thread-safe reads; one refresh thread.
class JobMapper {
 public:
  // `clock` times the refreshes (a test passes a FakeClock and advances it).
  JobMapper(std::shared_ptr<const CommandRunner> runner, JobMapperOptions options,
            std::map<std::string, std::vector<unsigned>> gpu_of_index, Clock& clock = RealClock());
  ~JobMapper();  // Stop()s
  JobMapper(const JobMapper&) = delete;
  JobMapper& operator=(const JobMapper&) = delete;

  // For the exporter: real scontrol, indexes from the gres.conf gpulet would generate for
  // `inventory` (whole GPUs and MIG devices by GPU index).
  static std::unique_ptr<JobMapper> ForNode(const gpu::Inventory& inventory,
                                            JobMapperOptions options);

  // One scontrol call; on success replaces the map, on failure keeps the last good one.
  Status Refresh();
  // Refreshes now and then every `refresh` on a background thread until Stop().
  void Start();
  void Stop();
  // GPU index → job id(s). Empty until the first successful refresh.
  JobsByGpuMap JobsByGpu() const;

 private:
  void Run(StopSignal& stop);

  SlurmClient client_;
  JobMapperOptions options_;
  std::map<std::string, std::vector<unsigned>> gpu_of_index_;
  Clock& clock_;
  mutable std::mutex mu_;
  JobsByGpuMap jobs_;
  std::unique_ptr<StopSignal> stop_;  // a fresh one per Start
  std::thread thread_;
};

}  // namespace gpulet::slurm
