#include "placement/trace.h"

#include <charconv>
#include <fstream>
#include <map>
#include <sstream>

namespace gpulet::placement {
namespace {

std::vector<std::string> SplitCsvLine(const std::string& line) {
  std::vector<std::string> fields;
  std::string field;
  std::istringstream in(line);
  while (std::getline(in, field, ',')) fields.push_back(field);
  if (!line.empty() && line.back() == ',') fields.emplace_back();
  for (std::string& f : fields)
    if (!f.empty() && f.back() == '\r') f.pop_back();
  return fields;
}

// A CSV file read row by row with its columns looked up by header name.
class CsvReader {
 public:
  static Result<CsvReader> Open(const std::string& path) {
    CsvReader r;
    r.path_ = path;
    r.in_.open(path);
    if (!r.in_) return Status(ErrorCode::kNotFound, path + ": cannot open");
    std::string header;
    if (!std::getline(r.in_, header))
      return Status(ErrorCode::kInvalidInput, path + ":1: empty file");
    r.line_ = 1;
    std::vector<std::string> names = SplitCsvLine(header);
    for (size_t i = 0; i < names.size(); ++i) r.columns_[names[i]] = i;
    return r;
  }

  Status Require(std::initializer_list<const char*> names) const {
    for (const char* n : names)
      if (!columns_.contains(n))
        return Status(ErrorCode::kInvalidInput,
                      path_ + ":1: missing column '" + std::string(n) + "'");
    return Status::Ok();
  }
  bool Has(const std::string& name) const { return columns_.contains(name); }

  // Next non-empty row; false at the end.
  bool Next() {
    std::string line;
    while (std::getline(in_, line)) {
      ++line_;
      if (line.empty() || line == "\r") continue;
      row_ = SplitCsvLine(line);
      return true;
    }
    return false;
  }

  std::string Text(const std::string& column) const {
    size_t i = columns_.at(column);
    return i < row_.size() ? row_[i] : std::string();
  }

  Result<int64_t> Int(const std::string& column, int64_t min, int64_t max) const {
    const std::string v = Text(column);
    int64_t out = 0;
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
    if (v.empty() || ec != std::errc() || end != v.data() + v.size())
      return Status(ErrorCode::kInvalidInput, Where(column) + ": not an integer: '" + v + "'");
    if (out < min || out > max)
      return Status(ErrorCode::kInvalidInput, Where(column) + ": " + v + " is out of range [" +
                                                  std::to_string(min) + ", " + std::to_string(max) +
                                                  "]");
    return out;
  }

  std::string Where(const std::string& column) const {
    return path_ + ":" + std::to_string(line_) + ": " + column;
  }

 private:
  std::string path_;
  std::ifstream in_;
  size_t line_ = 0;
  std::map<std::string, size_t> columns_;
  std::vector<std::string> row_;
};

constexpr int64_t kMaxInt = int64_t{1} << 40;

}  // namespace

Result<Cluster> LoadNodes(const std::string& path, const NodeListOptions& options) {
  Result<CsvReader> csv = CsvReader::Open(path);
  if (!csv.ok()) return csv.status();
  if (Status s = csv->Require({"sn", "cpu_milli", "memory_mib", "gpu", "model"}); !s.ok()) return s;
  Cluster cluster;
  while (csv->Next()) {
    Node node;
    node.name = csv->Text("sn");
    Result<int64_t> cpu = csv->Int("cpu_milli", 0, kMaxInt);
    if (!cpu.ok()) return cpu.status();
    Result<int64_t> mem = csv->Int("memory_mib", 0, kMaxInt);
    if (!mem.ok()) return mem.status();
    Result<int64_t> gpus = csv->Int("gpu", 0, kMaxGpusPerNode);
    if (!gpus.ok()) return gpus.status();
    const std::string model = csv->Text("model");
    if (*gpus == 0 && options.gpu_nodes_only) continue;
    if (*gpus > 0 && model.empty())
      return Status(ErrorCode::kInvalidInput, csv->Where("model") + ": empty for a GPU node");
    node.cpu_milli = node.cpu_free = *cpu;
    node.memory_mib = node.memory_free = *mem;
    node.gpu_free.assign(static_cast<size_t>(*gpus), kMilliPerGpu);
    if (*gpus > 0) {
      try {
        node.model = cluster.InternModel(model);
      } catch (const std::length_error&) {
        return Status(ErrorCode::kInvalidInput, csv->Where("model") + ": more than 64 GPU models");
      }
    }
    cluster.nodes.push_back(std::move(node));
  }
  return cluster;
}

Result<std::vector<Pod>> LoadPods(const std::string& path, const Cluster& cluster) {
  Result<CsvReader> csv = CsvReader::Open(path);
  if (!csv.ok()) return csv.status();
  if (Status s = csv->Require({"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"}); !s.ok())
    return s;
  const bool has_spec = csv->Has("gpu_spec");
  std::vector<Pod> pods;
  while (csv->Next()) {
    Pod pod;
    pod.name = csv->Text("name");
    Result<int64_t> cpu = csv->Int("cpu_milli", 0, kMaxInt);
    if (!cpu.ok()) return cpu.status();
    Result<int64_t> mem = csv->Int("memory_mib", 0, kMaxInt);
    if (!mem.ok()) return mem.status();
    Result<int64_t> num = csv->Int("num_gpu", 0, kMaxGpusPerNode);
    if (!num.ok()) return num.status();
    Result<int64_t> milli = csv->Int("gpu_milli", 0, kMilliPerGpu);
    if (!milli.ok()) return milli.status();
    if (*num > 0 && *milli == 0)
      return Status(ErrorCode::kInvalidInput,
                    csv->Where("gpu_milli") + ": 0 with num_gpu " + std::to_string(*num));
    if (*num > 1 && *milli != kMilliPerGpu)
      return Status(ErrorCode::kInvalidInput,
                    csv->Where("gpu_milli") +
                        ": a multi-GPU pod must take whole GPUs (1000), got " +
                        std::to_string(*milli));
    pod.cpu_milli = *cpu;
    pod.memory_mib = *mem;
    pod.num_gpu = static_cast<int32_t>(*num);
    pod.gpu_milli = *num > 0 ? static_cast<int32_t>(*milli) : 0;
    if (has_spec && pod.num_gpu > 0) {
      const std::string spec = csv->Text("gpu_spec");
      if (!spec.empty()) {
        pod.gpu_spec = spec;
        pod.model_constrained = true;
        std::istringstream in(spec);
        std::string model;
        while (std::getline(in, model, '|')) {
          int id = cluster.FindModel(model);
          if (id >= 0) pod.model_mask |= uint64_t{1} << id;
        }
      }
    }
    pods.push_back(std::move(pod));
  }
  return pods;
}

std::string TraceVariantPath(const std::string& dir, const std::string& variant) {
  return dir + "/openb_pod_list_" + variant + ".csv";
}

std::string GpuNodeListPath(const std::string& dir) {
  return dir + "/openb_node_list_gpu_node.csv";
}

}  // namespace gpulet::placement
