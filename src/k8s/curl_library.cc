#include "k8s/curl_library.h"

#include <dlfcn.h>

namespace gpulet::k8s {
namespace {

struct Loaded {
  CurlLibrary api{};
  const CurlLibrary* table = nullptr;
  std::string error;
};

const Loaded& Load() {
  static const Loaded* loaded = [] {
    auto* l = new Loaded();  // lives for the program: handles may outlive static destruction
    void* lib = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      l->error = std::string("cannot load libcurl.so.4 (Debian package libcurl4): ") +
                 (why != nullptr ? why : "unknown error");
      return l;
    }
    bool ok = true;
    auto resolve = [&](auto& fn, const char* name) {
      void* sym = dlsym(lib, name);
      if (sym == nullptr) {
        ok = false;
        l->error = std::string("libcurl.so.4 has no ") + name;
        return;
      }
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(sym);
    };
    resolve(l->api.global_init, "curl_global_init");
    resolve(l->api.easy_init, "curl_easy_init");
    resolve(l->api.easy_setopt, "curl_easy_setopt");
    resolve(l->api.easy_perform, "curl_easy_perform");
    resolve(l->api.easy_getinfo, "curl_easy_getinfo");
    resolve(l->api.easy_cleanup, "curl_easy_cleanup");
    resolve(l->api.easy_reset, "curl_easy_reset");
    resolve(l->api.easy_strerror, "curl_easy_strerror");
    resolve(l->api.slist_append, "curl_slist_append");
    resolve(l->api.slist_free_all, "curl_slist_free_all");
    if (!ok) return l;
    // curl_global_init is not thread-safe; this runs once, under the static's initialisation lock.
    if (l->api.global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
      l->error = "curl_global_init failed";
      return l;
    }
    l->table = &l->api;
    return l;
  }();
  return *loaded;
}

}  // namespace

const CurlLibrary* Curl() { return Load().table; }
const std::string& CurlLoadError() { return Load().error; }

}  // namespace gpulet::k8s
