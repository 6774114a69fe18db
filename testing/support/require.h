// What a test needs from the machine it runs on (../shared beside the checkout, root): a test that
// cannot have it SKIPS on a developer's machine, with the reason, so ctest's summary lists it as
// "Skipped" (gtest_discover_tests marks "[  SKIPPED ]" so), and FAILS under CI=true, where a green
// run must have run everything. Use these instead of a bare GTEST_SKIP for a missing requirement.
//
//   GPULET_REQUIRE_SHARED(path)   path (under ../shared) exists
//   GPULET_REQUIRE_ROOT(why)      effective uid 0; `why` says what root is needed for
//   GPULET_SKIP_OR_FAIL_IN_CI(why) any other requirement the test has checked itself
//
// Each returns from the calling function (a TEST body or SetUp), as GTEST_SKIP and FAIL do.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace gpulet::testing {

// Whether this run is CI's (CI=true, as GitHub Actions, GitLab and most CI systems set it).
inline bool InCi() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::string(ci) == "true";
}

#ifdef GPULET_SOURCE_DIR
// The shared/ directory beside the checkout: upstream files and traces this repository reads but
// must not copy.
inline std::string SharedDir() { return std::string(GPULET_SOURCE_DIR) + "/../shared"; }
#endif

}  // namespace gpulet::testing

#define GPULET_SKIP_OR_FAIL_IN_CI(why)                                                \
  do {                                                                                \
    if (::gpulet::testing::InCi()) {                                                  \
      FAIL() << "CI=true, but this test cannot run here: " << (why)                   \
             << " (CI runs as root, with `make deps` installed and ../shared beside " \
                "the checkout)";                                                      \
    }                                                                                 \
    GTEST_SKIP() << (why);                                                            \
  } while (0)

#define GPULET_REQUIRE_SHARED(path)                                    \
  do {                                                                 \
    const std::string gpulet_required_path_(path);                     \
    if (!std::filesystem::exists(gpulet_required_path_)) {             \
      GPULET_SKIP_OR_FAIL_IN_CI(gpulet_required_path_ +                \
                                " is absent (../shared is not beside " \
                                "the checkout)");                      \
    }                                                                  \
  } while (0)

#define GPULET_REQUIRE_ROOT(why)                                                          \
  do {                                                                                    \
    if (::geteuid() != 0) GPULET_SKIP_OR_FAIL_IN_CI(std::string("needs root: ") + (why)); \
  } while (0)
