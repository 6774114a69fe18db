#include "slurm/id_list.h"

#include <cctype>
#include <sstream>

namespace gpulet::slurm {
namespace {

std::string Strip(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::optional<unsigned> ParseNumber(const std::string& s, unsigned max) {
  if (s.empty() || s.size() > 9) return std::nullopt;
  unsigned v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<unsigned>(c - '0');
  }
  if (v > max) return std::nullopt;
  return v;
}

}  // namespace

std::optional<std::set<unsigned>> ParseIdList(const std::string& text, unsigned max) {
  std::set<unsigned> ids;
  if (Strip(text).empty()) return ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    item = Strip(item);
    size_t dash = item.find('-');
    if (dash == std::string::npos) {
      auto v = ParseNumber(item, max);
      if (!v) return std::nullopt;
      ids.insert(*v);
      continue;
    }
    auto lo = ParseNumber(Strip(item.substr(0, dash)), max);
    auto hi = ParseNumber(Strip(item.substr(dash + 1)), max);
    if (!lo || !hi || *lo > *hi) return std::nullopt;
    for (unsigned v = *lo; v <= *hi; ++v) ids.insert(v);
  }
  return ids;
}

std::string FormatIdList(const std::set<unsigned>& ids) {
  std::string out;
  auto it = ids.begin();
  while (it != ids.end()) {
    unsigned start = *it, end = *it;
    ++it;
    while (it != ids.end() && *it == end + 1) end = *it++;
    if (!out.empty()) out += ',';
    out += std::to_string(start);
    if (end != start) out += '-' + std::to_string(end);
  }
  return out;
}

}  // namespace gpulet::slurm
