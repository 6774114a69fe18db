#include "metrics/counters.h"

#include <fstream>
#include <map>
#include <sstream>

namespace gpulet::metrics {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

// Splits one CSV row: comma separated, fields trimmed, a field may be "quoted" ("" is a quote).
Result<std::vector<std::string>> SplitRow(std::string_view row) {
  std::vector<std::string> out;
  size_t i = 0;
  while (true) {
    while (i < row.size() && (row[i] == ' ' || row[i] == '\t')) ++i;
    std::string field;
    if (i < row.size() && row[i] == '"') {
      ++i;
      bool closed = false;
      while (i < row.size()) {
        if (row[i] == '"') {
          if (i + 1 < row.size() && row[i + 1] == '"') {
            field += '"';
            i += 2;
            continue;
          }
          closed = true;
          ++i;
          break;
        }
        field += row[i++];
      }
      if (!closed) return Status(ErrorCode::kInvalidInput, "unterminated quote");
      while (i < row.size() && (row[i] == ' ' || row[i] == '\t' || row[i] == '\r')) ++i;
      if (i < row.size() && row[i] != ',') {
        return Status(ErrorCode::kInvalidInput, "text after closing quote");
      }
    } else {
      size_t end = row.find(',', i);
      if (end == std::string_view::npos) end = row.size();
      field = std::string(Trim(row.substr(i, end - i)));
      i = end;
    }
    out.push_back(std::move(field));
    if (i >= row.size()) break;
    ++i;  // the comma
  }
  return out;
}

}  // namespace

const char* PromTypeName(PromType t) {
  switch (t) {
    case PromType::kGauge:
      return "gauge";
    case PromType::kCounter:
      return "counter";
    case PromType::kLabel:
      return "label";
  }
  return "gauge";
}

Result<CounterSet> ParseCounters(std::string_view text, const std::string& source) {
  CounterSet set;
  set.source = source;
  std::map<std::string, int> seen;  // field → line
  int line_no = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = Trim(text.substr(pos, nl - pos));
    pos = nl + 1;
    ++line_no;
    if (line.empty() || line.front() == '#') continue;
    const std::string where = source + ":" + std::to_string(line_no);
    auto cols = SplitRow(line);
    if (!cols.ok()) {
      return Status(ErrorCode::kInvalidInput,
                    where + ": malformed row: " + cols.status().message());
    }
    if (cols->size() != 3) {
      return Status(ErrorCode::kInvalidInput,
                    where + ": malformed row: want 3 columns (field, type, help), got " +
                        std::to_string(cols->size()));
    }
    Counter c;
    c.field = (*cols)[0];
    c.help = (*cols)[2];
    c.line = line_no;
    const std::string& type = (*cols)[1];
    if (type == "gauge") {
      c.type = PromType::kGauge;
    } else if (type == "counter") {
      c.type = PromType::kCounter;
    } else if (type == "label") {
      c.type = PromType::kLabel;
    } else if (type == "histogram" || type == "summary") {
      // dcgm-exporter accepts these types; gpulet publishes gauges and counters.
      set.skipped.push_back(where + ": " + c.field + ": type " + type +
                            " is not published by gpulet, row skipped");
      continue;
    } else {
      return Status(ErrorCode::kInvalidInput, where + ": " + c.field + ": unknown type \"" + type +
                                                  "\" (want gauge, counter or label)");
    }
    if (c.field.empty()) return Status(ErrorCode::kInvalidInput, where + ": empty field name");
    if (auto it = seen.find(c.field); it != seen.end()) {
      return Status(ErrorCode::kInvalidInput,
                    where + ": " + c.field + ": duplicate of line " + std::to_string(it->second));
    }
    seen.emplace(c.field, line_no);
    c.info = FindField(c.field);
    if (c.info == nullptr) {
      if (IsKnownUnsupportedField(c.field)) {
        set.skipped.push_back(where + ": " + c.field +
                              ": not readable through NVML by gpulet, row skipped");
        continue;
      }
      // Any other DCGM field (newer DCGM releases add some): skipped, not fatal to the file.
      if (c.field.rfind("DCGM_FI_", 0) == 0 || c.field.rfind("DCGM_EXP_", 0) == 0) {
        set.skipped.push_back(where + ": " + c.field + ": not collected by gpulet, row skipped");
        continue;
      }
      return Status(ErrorCode::kInvalidInput, where + ": " + c.field + ": unknown DCGM field");
    }
    if (c.type == PromType::kLabel && !c.info->is_label) {
      return Status(
          ErrorCode::kInvalidInput,
          where + ": " + c.field + ": numeric field cannot be a label row (use gauge or counter)");
    }
    if (c.type != PromType::kLabel && c.info->is_label) {
      return Status(ErrorCode::kInvalidInput,
                    where + ": " + c.field + ": string field must be a label row");
    }
    (c.type == PromType::kLabel ? set.labels : set.metrics).push_back(std::move(c));
  }
  return set;
}

Result<CounterSet> LoadCounters(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status(ErrorCode::kNotFound, "cannot read counters file " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ParseCounters(ss.str(), path);
}

CounterSet DefaultCounters() {
  static constexpr std::string_view kDefault =
      "DCGM_FI_DEV_SM_CLOCK, gauge, SM clock frequency (in MHz).\n"
      "DCGM_FI_DEV_MEM_CLOCK, gauge, Memory clock frequency (in MHz).\n"
      "DCGM_FI_DEV_MEMORY_TEMP, gauge, Memory temperature (in C).\n"
      "DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\n"
      "DCGM_FI_DEV_POWER_USAGE, gauge, Power draw (in W).\n"
      "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, counter, Total energy consumption since boot (in "
      "mJ).\n"
      "DCGM_FI_DEV_PCIE_REPLAY_COUNTER, counter, Total number of PCIe retries.\n"
      "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\n"
      "DCGM_FI_DEV_MEM_COPY_UTIL, gauge, Memory utilization (in %).\n"
      "DCGM_FI_DEV_ENC_UTIL, gauge, Encoder utilization (in %).\n"
      "DCGM_FI_DEV_DEC_UTIL, gauge, Decoder utilization (in %).\n"
      "DCGM_FI_DEV_XID_ERRORS, gauge, Value of the last XID error encountered.\n"
      "DCGM_FI_DEV_FB_FREE, gauge, Framebuffer memory free (in MiB).\n"
      "DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).\n"
      "DCGM_FI_DEV_FB_RESERVED, gauge, Framebuffer memory reserved (in MiB).\n"
      "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, counter, Total NVLink traffic of all links with "
      "protocol overhead (in B).\n"
      "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, counter, Total number of single-bit volatile ECC errors.\n"
      "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, Total number of double-bit volatile ECC errors.\n"
      "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL, counter, Total number of single-bit persistent ECC errors.\n"
      "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL, counter, Total number of double-bit persistent ECC errors.\n"
      "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, counter, Number of remapped rows for uncorrectable "
      "errors\n"
      "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS, counter, Number of remapped rows for correctable "
      "errors\n"
      "DCGM_FI_DEV_ROW_REMAP_FAILURE, gauge, Whether remapping of rows has failed\n"
      "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, gauge, Current clock throttle reasons (bitmask).\n"
      "DCGM_FI_DRIVER_VERSION, label, Driver Version\n"
      "DCGM_FI_PROF_GR_ENGINE_ACTIVE, gauge, Ratio of time the graphics engine is active.\n"
      "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, Ratio of cycles any tensor pipe is active.\n"
      "DCGM_FI_PROF_DRAM_ACTIVE, gauge, Ratio of cycles the device memory interface is active.\n"
      "DCGM_FI_PROF_PCIE_TX_BYTES, gauge, PCIe transmit rate with headers (in B/s).\n"
      "DCGM_FI_PROF_PCIE_RX_BYTES, gauge, PCIe receive rate with headers (in B/s).\n";
  auto set = ParseCounters(kDefault, "<built-in>");
  return set.ok() ? std::move(set).value() : CounterSet{};
}

}  // namespace gpulet::metrics
