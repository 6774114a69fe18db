#include "k8s/quantity.h"

#include <string>

namespace gpulet::k8s {
namespace {

// 128 bits: 36 significant digits times 2^60 (Ei) still fit before the range check.
__extension__ typedef unsigned __int128 Wide;

bool Digit(char c) { return c >= '0' && c <= '9'; }

Status Bad(std::string_view text, const std::string& why) {
  return Status(ErrorCode::kInvalidInput, "\"" + std::string(text.substr(0, 64)) + "\": " + why);
}

// The suffix's power of ten and power of two; false when it is not one.
bool Suffix(std::string_view s, int* exp10, int* exp2) {
  *exp10 = 0;
  *exp2 = 0;
  if (s.empty()) return true;
  if (s.size() == 2 && s[1] == 'i') {
    const std::string_view binary = "KMGTPE";
    const size_t k = binary.find(s[0]);
    if (k == std::string_view::npos) return false;
    *exp2 = 10 * static_cast<int>(k + 1);
    return true;
  }
  if (s.size() == 1) {
    switch (s[0]) {
      case 'n':
        *exp10 = -9;
        return true;
      case 'u':
        *exp10 = -6;
        return true;
      case 'm':
        *exp10 = -3;
        return true;
      case 'k':
        *exp10 = 3;
        return true;
      case 'M':
        *exp10 = 6;
        return true;
      case 'G':
        *exp10 = 9;
        return true;
      case 'T':
        *exp10 = 12;
        return true;
      case 'P':
        *exp10 = 15;
        return true;
      case 'E':
        *exp10 = 18;
        return true;
      default:
        return false;
    }
  }
  if (s[0] != 'e' && s[0] != 'E') return false;
  size_t i = 1;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  if (i >= s.size()) return false;
  int64_t e = 0;
  for (; i < s.size(); ++i) {
    if (!Digit(s[i])) return false;
    e = std::min<int64_t>(e * 10 + (s[i] - '0'), 100000);  // beyond any int64 either way
  }
  *exp10 = static_cast<int>(negative ? -e : e);
  return true;
}

}  // namespace

Result<int64_t> ParseWholeQuantity(std::string_view text, int64_t max) {
  if (text.empty()) return Bad(text, "not a quantity (empty)");
  size_t i = 0;
  bool negative = false;
  if (text[0] == '+' || text[0] == '-') negative = text[i++] == '-';
  // The significant digits (leading zeros dropped) and the power of ten they are scaled by.
  std::string digits;
  int64_t exp10 = 0;
  size_t seen = 0;  // digits of either part, zeros included
  for (; i < text.size() && Digit(text[i]); ++i, ++seen) {
    if (!digits.empty() || text[i] != '0') digits += text[i];
  }
  if (i < text.size() && text[i] == '.') {
    for (++i; i < text.size() && Digit(text[i]); ++i, ++seen) {
      if (!digits.empty() || text[i] != '0') digits += text[i];
      --exp10;
    }
  }
  if (seen == 0) return Bad(text, "not a quantity (no digits)");
  int suffix10 = 0, suffix2 = 0;
  if (!Suffix(text.substr(i), &suffix10, &suffix2)) {
    return Bad(text, "not a quantity (unknown suffix \"" + std::string(text.substr(i, 16)) +
                         "\"; use k M G T P E, Ki Mi Gi Ti Pi Ei, or an exponent e3)");
  }
  exp10 += suffix10;
  while (!digits.empty() && digits.back() == '0') {
    digits.pop_back();
    ++exp10;
  }
  if (digits.empty()) return int64_t{0};  // -0 is 0
  if (negative) return Bad(text, "must not be negative");
  const std::string too_large = "larger than " + std::to_string(max);
  // value = digits × 10^exp10 × 2^suffix2. digits has no trailing zero: with exp10 < 0 it is a
  // whole number only if 10^-exp10 divides digits × 2^suffix2.
  if (static_cast<int64_t>(digits.size()) + std::max<int64_t>(exp10, 0) > 36) {
    return Bad(text, too_large);
  }
  if (exp10 < -36) return Bad(text, "not a whole number");
  Wide v = 0;
  for (char c : digits) v = v * 10 + static_cast<unsigned>(c - '0');
  const Wide limit = static_cast<Wide>(1) << 126;
  for (int64_t k = 0; k < exp10; ++k) v *= 10;  // at most 36 digits in all: below 2^120
  for (int k = 0; k < suffix2; ++k) {
    if (v >= limit) return Bad(text, too_large);
    v <<= 1;
  }
  for (int64_t k = 0; k < -exp10; ++k) {
    if (v % 10 != 0) return Bad(text, "not a whole number");
    v /= 10;
  }
  if (v > static_cast<Wide>(max)) return Bad(text, too_large);
  return static_cast<int64_t>(v);
}

}  // namespace gpulet::k8s
