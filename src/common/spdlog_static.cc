// spdlog and {fmt}, compiled into the product binary from Debian's headers.
//
// Debian ships both libraries as shared objects only. The product binary links them from this file
// instead (GPULET_STATIC_CXX, top CMakeLists.txt), together with libstdc++ and yaml-cpp's archive:
// then `gpulet` loads no C++ runtime library at all, and its linker keeps and orders only the
// functions the agents reach (docs/benchmarks.md, "DRA kubelet plugin": libstdc++.so, spdlog, fmt
// and yaml-cpp kept 2.6 MiB resident in `gpulet dra`, mostly pages it maps and never uses).
//
// Every other target (the tests, the sanitizer builds) keeps the shared libraries. This file is
// compiled as the shared libraries' users are (SPDLOG_COMPILED_LIB, SPDLOG_FMT_EXTERNAL), so the
// definitions here are the ones the rest of the tree's objects expect.
#if !defined(SPDLOG_COMPILED_LIB) || !defined(SPDLOG_FMT_EXTERNAL) || defined(FMT_HEADER_ONLY)
#error "spdlog_static.cc is compiled with SPDLOG_COMPILED_LIB and SPDLOG_FMT_EXTERNAL only"
#endif

// {fmt}: the out-of-line functions (format-inl.h defines them when FMT_HEADER_ONLY is not set),
// and the templates format.h declares `extern` for its users.
#include <fmt/format-inl.h>

namespace fmt {
inline namespace v9 {
namespace detail {
template auto dragonbox::to_decimal(float x) noexcept -> dragonbox::decimal_fp<float>;
template auto dragonbox::to_decimal(double x) noexcept -> dragonbox::decimal_fp<double>;
template locale_ref::locale_ref(const std::locale& loc);
template auto locale_ref::get<std::locale>() const -> std::locale;
template auto thousands_sep_impl(locale_ref) -> thousands_sep_result<char>;
template auto decimal_point_impl(locale_ref) -> char;
template void buffer<char>::append(const char*, const char*);
template void vformat_to(buffer<char>&, string_view, basic_format_args<FMT_BUFFER_CONTEXT(char)>,
                         locale_ref);
template auto thousands_sep_impl(locale_ref) -> thousands_sep_result<wchar_t>;
template auto decimal_point_impl(locale_ref) -> wchar_t;
template void buffer<wchar_t>::append(const wchar_t*, const wchar_t*);
}  // namespace detail
}  // namespace v9
}  // namespace fmt

// spdlog: the core (registry, logger, pattern formatter, OS helpers) and the sinks gpulet uses
// (src/common/log.cc: stderr, and the default logger's colour sink).
#include <mutex>

#include <spdlog/common-inl.h>
#include <spdlog/details/backtracer-inl.h>
#include <spdlog/details/log_msg-inl.h>
#include <spdlog/details/log_msg_buffer-inl.h>
#include <spdlog/details/null_mutex.h>
#include <spdlog/details/os-inl.h>
#include <spdlog/details/periodic_worker-inl.h>
#include <spdlog/details/registry-inl.h>
#include <spdlog/logger-inl.h>
#include <spdlog/pattern_formatter-inl.h>
#include <spdlog/sinks/ansicolor_sink-inl.h>
#include <spdlog/sinks/base_sink-inl.h>
#include <spdlog/sinks/sink-inl.h>
#include <spdlog/sinks/stdout_color_sinks-inl.h>
#include <spdlog/sinks/stdout_sinks-inl.h>
#include <spdlog/spdlog-inl.h>

template class spdlog::sinks::base_sink<std::mutex>;
template class spdlog::sinks::base_sink<spdlog::details::null_mutex>;

template class spdlog::sinks::stdout_sink_base<spdlog::details::console_mutex>;
template class spdlog::sinks::stdout_sink_base<spdlog::details::console_nullmutex>;
template class spdlog::sinks::stdout_sink<spdlog::details::console_mutex>;
template class spdlog::sinks::stdout_sink<spdlog::details::console_nullmutex>;
template class spdlog::sinks::stderr_sink<spdlog::details::console_mutex>;
template class spdlog::sinks::stderr_sink<spdlog::details::console_nullmutex>;
template std::shared_ptr<spdlog::logger>
spdlog::stderr_logger_mt<spdlog::synchronous_factory>(const std::string& logger_name);

template class spdlog::sinks::ansicolor_sink<spdlog::details::console_mutex>;
template class spdlog::sinks::ansicolor_stdout_sink<spdlog::details::console_mutex>;
template class spdlog::sinks::ansicolor_stderr_sink<spdlog::details::console_mutex>;
