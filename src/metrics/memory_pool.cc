#include "metrics/memory_pool.h"

namespace gpulet::metrics {
namespace {

// A label value in the text format: backslash, quote and newline escaped.
std::string Escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::vector<MemoryPoolGpu> MemoryPoolFromDocument(const nlohmann::json& document) {
  std::vector<MemoryPoolGpu> out;
  if (!document.is_object() || !document.contains("gpus") || !document["gpus"].is_array()) {
    return out;
  }
  const std::string resource = document.value("resource", "");
  for (const nlohmann::json& g : document["gpus"]) {
    if (!g.is_object()) continue;
    try {
      MemoryPoolGpu m;
      m.resource = resource;
      m.uuid = g.at("uuid").get<std::string>();
      m.index = g.at("index").get<unsigned>();
      m.total = g.at("totalUnits").get<int>();
      m.allocated = m.total - g.at("freeUnits").get<int>();
      out.push_back(std::move(m));
    } catch (const std::exception&) {
      continue;
    }
  }
  return out;
}

std::string RenderMemoryPool(const std::vector<MemoryPoolGpu>& gpus) {
  if (gpus.empty()) return "";
  std::string out;
  auto family = [&](const char* name, const char* help, int MemoryPoolGpu::*value) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " gauge\n";
    for (const MemoryPoolGpu& g : gpus) {
      out += std::string(name) + "{gpu=\"" + std::to_string(g.index) + "\",UUID=\"" +
             Escape(g.uuid) + "\",resource=\"" + Escape(g.resource) + "\"} " +
             std::to_string(g.*value) + "\n";
    }
  };
  family("gpulet_memory_pool_allocated_units",
         "Memory-pool units of this GPU allocated to containers (the device plugin's count).",
         &MemoryPoolGpu::allocated);
  family("gpulet_memory_pool_units", "Memory-pool units this GPU is split into.",
         &MemoryPoolGpu::total);
  return out;
}

void MemoryPoolGauges::Set(std::vector<MemoryPoolGpu> gpus) {
  std::string text = RenderMemoryPool(gpus);
  std::lock_guard lock(mu_);
  text_ = std::move(text);
}

std::string MemoryPoolGauges::Text() const {
  std::lock_guard lock(mu_);
  return text_;
}

}  // namespace gpulet::metrics
