// FNV-1a, 64-bit: a stable, non-cryptographic hash of bytes, for checksums of our own files and
// short stable names. Not for anything an adversary chooses to collide.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace gpulet {

inline uint64_t Fnv1a64(std::string_view bytes) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

// Fnv1a64 as 16 lower-case hex digits.
inline std::string Fnv64Hex(std::string_view bytes) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(Fnv1a64(bytes)));
  return buf;
}

}  // namespace gpulet
