// Replay results as files: CSV (one row per policy and load point), JSON (the same plus failed pods
// and every run), and an SVG plot of the allocation ratio against the arrived load, one line per
// policy (the band around a line spans the seeds' minimum to maximum).
#pragma once

#include <span>
#include <string>

#include "placement/replay.h"

namespace gpulet::placement {

struct ReportInfo {
  std::string trace;  // what was replayed (variant name or path)
  std::string nodes;  // the node list
  double load = 0;
};

std::string RenderCsv(std::span<const PolicySummary> summaries);
std::string RenderJson(const ReportInfo& info, std::span<const PolicySummary> summaries,
                       std::span<const ReplayResult> runs);
std::string RenderSvg(const ReportInfo& info, std::span<const PolicySummary> summaries);

}  // namespace gpulet::placement
