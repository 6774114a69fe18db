#include "common/listen_address.h"

#include <algorithm>

namespace gpulet {

Result<ListenAddress> ParseListenAddress(const std::string& text) {
  ListenAddress a;
  std::string port_text;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return Status(ErrorCode::kUsage, "bad listen address \"" + text + "\" (want [host]:port)");
    }
    a.host = text.substr(1, close - 1);
    port_text = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos) {
      return Status(ErrorCode::kUsage,
                    "bad listen address \"" + text + "\" (want [host]:port, e.g. :9400)");
    }
    a.host = text.substr(0, colon);
    if (a.host.find(':') != std::string::npos) {
      return Status(ErrorCode::kUsage,
                    "bad listen address \"" + text + "\" (IPv6 hosts go in brackets: [::1]:9400)");
    }
    port_text = text.substr(colon + 1);
  }
  if (a.host.empty()) a.host = "0.0.0.0";
  if (port_text.empty() || port_text.size() > 5 ||
      !std::all_of(port_text.begin(), port_text.end(),
                   [](char c) { return c >= '0' && c <= '9'; })) {
    return Status(ErrorCode::kUsage, "bad port in listen address \"" + text + "\"");
  }
  a.port = std::stoi(port_text);
  if (a.port > 65535) return Status(ErrorCode::kUsage, "port out of range in \"" + text + "\"");
  return a;
}

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

}  // namespace gpulet
