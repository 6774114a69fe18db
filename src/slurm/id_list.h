// Slurm's compact lists of non-negative integers ("0-55,112-167", "0,2-3"), used for CPU lists
// (sysfs local_cpulist), gres.conf Cores= and the GRES index sets of `scontrol show job -d`.
#pragma once

#include <optional>
#include <set>
#include <string>

namespace gpulet::slurm {

// Parses "a,b-c,…" (whitespace around items ignored; empty string = empty set). Returns nullopt
// on anything else: a negative or non-numeric item, a reversed range, or a value above `max`.
std::optional<std::set<unsigned>> ParseIdList(const std::string& text, unsigned max = 1u << 20);

// The shortest "a,b-c" form of `ids` (ascending; consecutive runs collapse into ranges).
std::string FormatIdList(const std::set<unsigned>& ids);

}  // namespace gpulet::slurm
