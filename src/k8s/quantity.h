// Kubernetes quantities (resource.Quantity's text form), for requests of extended resources.
//
// Grammar, as k8s.io/apimachinery/pkg/api/resource parses it:
//   quantity  ::= [sign] number suffix
//   number    ::= digits | digits "." [digits] | "." digits
//   suffix    ::= "" | binary | decimal | ("e" | "E") [sign] digits
//   binary    ::= Ki | Mi | Gi | Ti | Pi | Ei                  (powers of 1024)
//   decimal   ::= n | u | m | k | M | G | T | P | E            (powers of 1000)
// "2k" = 2000, "2Ki" = 2048, "1.5Gi" = 1610612736, "1e3" = 1000, "2000m" = 2, "1E" = 10^18
// (E alone is exa; E followed by digits is an exponent). No spaces, no "K", no "KiB".
// The API server writes a request back in canonical form (2,000 becomes "2k"), so every form
// must be read.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/status.h"

namespace gpulet::k8s {

// The value of `text` when it is a whole number in [0, max]. Errors (kInvalidInput) say which
// rule failed: not a quantity (the grammar above), negative, not a whole number ("1500m"), or
// larger than `max`.
Result<int64_t> ParseWholeQuantity(std::string_view text, int64_t max = INT64_MAX);

}  // namespace gpulet::k8s
