// Errors as values. Exceptions stop at module boundaries; above them a function that can fail
// returns Status or Result<T>. Every error carries an ErrorCode (which maps to the process exit
// code, so scripts can tell failures apart) and a one-line message that names its input.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace gpulet {

// Process exit codes. Stable: documented in docs/operations.md.
enum class ErrorCode : int {
  kOk = 0,
  kInternal = 1,
  kUsage = 2,         // bad flag or argument
  kInvalidInput = 3,  // config/fixture/file content invalid (message names file:line:field)
  kNotFound = 4,      // a named thing (file, fixture, device) does not exist
  kUnavailable = 5,   // a peer (kubelet, slurmctld, API server) is not reachable
  kNvmlLibraryMissing = 10,
  kNvmlSymbolMissing = 11,
  kNvmlInitFailed = 12,
  kGpuLost = 13,    // a GPU was lost during discovery: inventory incomplete
  kNvmlError = 14,  // any other NVML failure during discovery
};

class Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return {}; }

  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  int exit_code() const { return static_cast<int>(code_); }

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

// Result<T> holds either a value or a non-ok Status.
template <typename T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {}  // NOLINT(google-explicit-constructor)
  Result(ErrorCode code, std::string message) : v_(Status(code, std::move(message))) {}

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }
  const T& value() const& { return std::get<T>(v_); }
  T& value() & { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }
  // The error; an ok Status when this holds a value. The reference lives as long as this Result.
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }

 private:
  std::variant<T, Status> v_;
};

}  // namespace gpulet
