// Where the tests find what the build made (the gpulet binary, libgpulet-cuda.so, the probes):
// $GPULET_BUILD_DIR when set (a test run against another build), else the build directory the
// test was compiled in; and a word quoted for `sh -c`.
#pragma once

#include <cstdlib>
#include <string>

namespace gpulet::testing {

inline std::string BuildDir() {
  const char* b = std::getenv("GPULET_BUILD_DIR");
  return b != nullptr ? b : GPULET_BUILD_DIR;
}

// 'text' with each ' written as '\'' : one word to the shell, whatever it holds.
inline std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace gpulet::testing
