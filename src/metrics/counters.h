// The counters file: which DCGM fields to publish, in dcgm-exporter's CSV format.
//
//   # comment
//   DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).
//   DCGM_FI_DRIVER_VERSION, label, Driver Version
//
// Each row is `field, type, help` with type gauge|counter|label; fields are trimmed, and a field
// may be double-quoted to contain commas. `label` rows add a label (named after the field) to every
// series instead of a series of their own. A DCGM field gpulet does not collect (any DCGM_FI_* or
// DCGM_EXP_* name it does not know) and a histogram or summary row are skipped (kept in `skipped`
// for one warning each); a name that is no DCGM field, an unknown type or a malformed row is an
// error naming file:line. NVIDIA's default-counters.csv loads unchanged.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "metrics/fields.h"

namespace gpulet::metrics {

enum class PromType { kGauge, kCounter, kLabel };
const char* PromTypeName(PromType t);  // "gauge", "counter", "label"

struct Counter {
  std::string field;  // DCGM field name, also the metric (or label) name
  PromType type = PromType::kGauge;
  std::string help;
  int line = 0;
  const FieldInfo* info = nullptr;  // never null in a parsed CounterSet
};

struct CounterSet {
  std::string source;             // file path, or "<built-in>"
  std::vector<Counter> metrics;   // gauge and counter rows, in file order
  std::vector<Counter> labels;    // label rows, in file order
  std::vector<std::string> skipped;  // "file:line: FIELD: why", one per skipped row
};

Result<CounterSet> ParseCounters(std::string_view text, const std::string& source);
Result<CounterSet> LoadCounters(const std::string& path);

// The counters used without -f: dcgm-exporter's default rows that gpulet can read, plus the ECC
// totals and remapped-row fields the alert rules use.
CounterSet DefaultCounters();

}  // namespace gpulet::metrics
