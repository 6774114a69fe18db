// The broker's journal on disk: each node's owner and in-transit step plus the hysteresis
// counters, as one JSON file replaced atomically (common/files.h WriteFileAtomic: temporary
// file, fsync, rename, fsync the directory). A broker restarted after a crash reads it and resumes a transition where it stood
// instead of repeating or forgetting it.
//
// The broker writes the journal BEFORE it acts (intent first): a crash between the write and the
// action leaves a journal that is one step ahead of the clusters, and every step of the engine is
// an idempotent "make it so" that the next evaluation simply re-issues.
#pragma once

#include <string>

#include "broker/model.h"
#include "common/status.h"

namespace gpulet::broker {

std::string JournalToJson(const Journal& journal);
// Errors: kInvalidInput "SOURCE: field: problem".
Result<Journal> JournalFromJson(const std::string& text, const std::string& source);

// A missing file is an empty journal (every node with Slurm); an unreadable or corrupt one is an
// error (the broker then refuses to start rather than forget a transition).
Result<Journal> LoadJournal(const std::string& path);
Status SaveJournal(const std::string& path, const Journal& journal);

}  // namespace gpulet::broker
