// The kubelet plugin's state on disk: every claim it prepared (or began to prepare), with what
// Unprepare needs after a restart, the claim gone from the API server, or the other instance of a
// rolling update taking over. One JSON file, replaced atomically (temp + fsync + rename + directory
// fsync, common/files.h), stamped with the node name and the boot ID and sealed with a checksum.
//
// Loading tells apart: no file (a first start), a good file, a corrupted one (not JSON, bad
// checksum, unknown version, a field of the wrong type) and a foreign one (another boot: the CDI
// specs in /var/run and the MIG devices are gone; or another node: a copied disk). A corrupted or
// foreign file is renamed aside (<file>.corrupt-<unix time> / .foreign-<unix time>), never deleted
// and never fatal: the plugin rebuilds its state from the API server.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "dra/claim.h"
#include "dra/preparer.h"

namespace gpulet::dra {

struct CheckpointDevice : PreparedDevice {
  bool admin_access = false;  // admin access ignores ordinary allocations (no conflict check)
};

struct CheckpointEntry {
  enum class State {
    kPreparing,  // in memory during a Prepare (the plugin writes only outcomes); a file holding
                 // one is read, and Unprepare then asks the Preparer to undo it
    kPrepared,   // the Preparer succeeded: devices and record_json are what it returned
  };
  ClaimRef ref;
  State state = State::kPreparing;
  std::vector<CheckpointDevice> devices;
  std::string record_json;  // PrepareResult::record_json, the Preparer's own format
};

struct Checkpoint {
  std::string node_name;
  std::string boot_id;
  std::map<std::string, CheckpointEntry> claims;  // by claim UID
  // A corrupted or foreign checkpoint was set aside and the rebuild from the API server has not
  // succeeded yet: an unknown claim may still hold devices.
  bool rebuild_pending = false;
};

inline constexpr size_t kMaxCheckpointBytes = 64u << 20;

// The file's text: {"version":1,"node":...,"bootID":...,"claims":{...},"checksum":"<fnv64>"}.
std::string SerializeCheckpoint(const Checkpoint& checkpoint);
// kInvalidInput naming `source` and what is wrong.
Result<Checkpoint> ParseCheckpoint(const std::string& text, const std::string& source);
// SerializeCheckpoint written with WriteFileAtomic (mode 0600).
Status WriteCheckpoint(const std::string& path, const Checkpoint& checkpoint);

struct LoadedCheckpoint {
  enum class Outcome { kMissing, kLoaded, kCorrupt, kForeign };
  Outcome outcome = Outcome::kMissing;
  Checkpoint checkpoint;   // kLoaded: the file; otherwise empty with node_name and boot_id set
                           // (and rebuild_pending when kCorrupt/kForeign)
  std::string problem;     // kCorrupt/kForeign: what was wrong, naming the file
  std::string kept_aside;  // kCorrupt/kForeign: where the file was moved ("" if the move failed)
};

// Reads `path`; a corrupted or foreign file is logged (naming the file), moved aside and reported.
// Errors only for what is not the file's fault (the directory cannot be read).
Result<LoadedCheckpoint> LoadCheckpoint(const std::string& path, const std::string& node_name,
                                        const std::string& boot_id);

// The boot ID: the first line of `path` (/proc/sys/kernel/random/boot_id), trimmed, at most 64
// characters.
Result<std::string> ReadBootId(const std::string& path);


}  // namespace gpulet::dra
