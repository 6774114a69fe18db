// The driver's entry points, resolved in one place (issue 36): which driver library is the real
// one (the node's decision: the limits file's path or a fixed one, never the environment or
// LD_LIBRARY_PATH), libc's own dlsym found without our interposed one, and the table of wrapped
// and plain entry points, each looked up with dlsym on the driver's handle only. Nothing a
// program's own lookup finds (RTLD_DEFAULT finds our exports first; a tenant library may export
// a no-op of the same name) is ever recorded here; the one other writer is cuGetProcAddress,
// with the driver's own answer.
//
// Part of libgpulet-cuda.so's single translation unit: included by shim.cc only (the library is
// built from shim.cc and region.cc alone, also by scripts/device-check-memory-limits.sh), so its
// definitions are internal to the library.
#pragma once

#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <unordered_map>

#include "cudashim/cuda_api.h"
#include "cudashim/region.h"

#define GPULET_EXPORT extern "C" __attribute__((visibility("default")))

namespace gpulet::cudashim {
namespace {  // NOLINT(google-build-namespaces, cert-dcl59-cpp): one translation unit (above)

void Say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
struct State;
State& S();
// The driver library the node named (the limits file) or the first fixed path that exists.
const char* NodeDriverPath(State& s);

// ---- the real dlsym, found without calling the interposed one ----------------------------------

using DlsymFn = void* (*)(void*, const char*) noexcept;

// Runs before the sanitizer runtimes are ready when a sanitizer's own start-up asks dlsym for
// RTLD_NEXT (it finds ours first): no instrumentation on this path.
#define GPULET_NO_SANITIZE __attribute__((no_sanitize("address", "undefined", "thread")))

GPULET_NO_SANITIZE DlsymFn ResolveRealDlsym() {
  // dlvsym is not interposed: asking it for libc's dlsym cannot recurse into ours.
  const char* versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
  for (const char* version : versions) {
    if (void* p = ::dlvsym(RTLD_NEXT, "dlsym", version)) return reinterpret_cast<DlsymFn>(p);
  }
  std::fprintf(stderr, "gpulet-cuda: cannot find libc's dlsym (dlvsym failed); aborting\n");
  std::abort();
}

// libc's dlsym, once found. Written only with the value every writer computes alike.
// (Builtins, not std::atomic: its inline members would carry sanitizer instrumentation.)
DlsymFn g_real_dlsym = nullptr;

GPULET_NO_SANITIZE DlsymFn RealDlsym() {
  DlsymFn fn = __atomic_load_n(&g_real_dlsym, __ATOMIC_ACQUIRE);
  if (fn == nullptr) {
    fn = ResolveRealDlsym();
    __atomic_store_n(&g_real_dlsym, fn, __ATOMIC_RELEASE);
  }
  return fn;
}

// The driver library every wrapper calls: the path the node named in the limits file, else the
// first of the fixed list (region.h) that exists. Opened by absolute path, so neither the process
// environment nor LD_LIBRARY_PATH (nor a copy a tenant library already loaded under the same
// soname) decides which driver it is: a path with a slash is opened as named, and an object
// already loaded from that file is the same object. Every entry point of the table is looked up
// in this handle only (RealFor), never by RTLD_DEFAULT/RTLD_NEXT, which find our own exports.
void* DriverHandle() {
  static void* handle = [] {
    const char* path = NodeDriverPath(S());
    if (path == nullptr) {
      Say("no CUDA driver library: the limits file names none and none of the fixed paths "
          "(/usr/lib/x86_64-linux-gnu/libcuda.so.1, ...) exists; CUDA is refused");
      return static_cast<void*>(nullptr);
    }
    void* h = ::dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (h == nullptr) h = ::dlopen(path, RTLD_NOW);
    if (h == nullptr) Say("cannot load the CUDA driver %s: %s", path, ::dlerror());
    return h;
  }();
  return handle;
}

void* NvmlHandle() {
  static void* handle = [] {
    void* h = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (h == nullptr) h = ::dlopen("libnvidia-ml.so.1", RTLD_NOW);
    return h;
  }();
  return handle;
}

// ---- the wrapped entry points and their real counterparts -------------------------------------

enum HookIndex : int {
#define GPULET_INDEX(name, base, since, ptsz, ret, params) k_##name,
  GPULET_CUDA_WRAPPED(GPULET_INDEX) GPULET_CUDA_PLAIN(GPULET_INDEX)
#undef GPULET_INDEX
#define GPULET_LEGACY_INDEX(name, base, since) k_##name,
      GPULET_CUDA_LEGACY(GPULET_LEGACY_INDEX)
#undef GPULET_LEGACY_INDEX
          kHookCount
};

struct Hook {
  const char* name;
  const char* base;
  int since;
  bool ptsz;
  bool wrapped;  // false: a driver function we only call
  bool legacy;   // refused
  void* wrapper;
  std::atomic<void*> real{nullptr};
};

}  // namespace
}  // namespace gpulet::cudashim

// Forward declarations of the legacy refusals (defined at the end, variadic: never reads args).
#define GPULET_LEGACY_DECLARE(name, base, since) GPULET_EXPORT CUresult name(...);
GPULET_CUDA_LEGACY(GPULET_LEGACY_DECLARE)
#undef GPULET_LEGACY_DECLARE

namespace gpulet::cudashim {
namespace {  // NOLINT(google-build-namespaces, cert-dcl59-cpp)

Hook g_hooks[kHookCount] = {
#define GPULET_HOOK(name, base, since, ptsz, ret, params) \
  {#name, #base, since, ptsz != 0, true, false, reinterpret_cast<void*>(&::name), {}},
    GPULET_CUDA_WRAPPED(GPULET_HOOK)
#undef GPULET_HOOK
#define GPULET_PLAIN_HOOK(name, base, since, ptsz, ret, params) \
  {#name, #base, since, ptsz != 0, false, false, nullptr, {}},
        GPULET_CUDA_PLAIN(GPULET_PLAIN_HOOK)
#undef GPULET_PLAIN_HOOK
#define GPULET_LEGACY_HOOK(name, base, since) \
  {#name, #base, since, false, true, true, reinterpret_cast<void*>(&::name), {}},
            GPULET_CUDA_LEGACY(GPULET_LEGACY_HOOK)
#undef GPULET_LEGACY_HOOK
};

void* RealFor(int index) {
  Hook& h = g_hooks[index];
  void* p = h.real.load(std::memory_order_acquire);
  if (p != nullptr) return p;
  if (void* lib = DriverHandle()) p = RealDlsym()(lib, h.name);
  if (p != nullptr) h.real.store(p, std::memory_order_release);
  return p;
}

// REAL(cuMemAlloc_v2) is the driver's function with our declared type, or nullptr.
#define REAL(name) (reinterpret_cast<decltype(&::name)>(RealFor(k_##name)))
// Calls the driver's function, or answers CUDA_ERROR_NOT_FOUND when the driver has none.
#define CALL_REAL(name, ...)                              \
  do {                                                    \
    auto real_fn_ = REAL(name);                           \
    if (real_fn_ == nullptr) return CUDA_ERROR_NOT_FOUND; \
    return real_fn_(__VA_ARGS__);                         \
  } while (0)

// Name → hook, for dlsym and cuGetProcAddress (exact exported names and base names).
struct NameIndex {
  std::unordered_map<std::string_view, int> exact;
  std::unordered_multimap<std::string_view, int> by_base;
};

const NameIndex& Names() {
  static const NameIndex* index = [] {
    auto* n = new NameIndex();
    for (int i = 0; i < kHookCount; ++i) {
      if (!g_hooks[i].wrapped) continue;
      n->exact.emplace(g_hooks[i].name, i);
      n->by_base.emplace(g_hooks[i].base, i);
    }
    return n;
  }();
  return *index;
}

}  // namespace
}  // namespace gpulet::cudashim
