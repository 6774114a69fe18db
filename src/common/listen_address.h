// Listen addresses, as Prometheus exporters and kube components write them: "[host]:port",
// ":9400" (all IPv4 interfaces), "127.0.0.1:9400", "[::1]:9400". Port 0 asks the kernel for one.
#pragma once

#include <string>

#include "common/status.h"

namespace gpulet {

struct ListenAddress {
  std::string host;  // "0.0.0.0" when the text gave none; IPv6 without brackets
  int port = 0;
  bool operator==(const ListenAddress&) const = default;
};

// Errors are kUsage naming the text.
Result<ListenAddress> ParseListenAddress(const std::string& text);

// True for 127.0.0.0/8, ::1 and "localhost": an address only this machine can reach.
bool IsLoopback(const std::string& host);

}  // namespace gpulet
