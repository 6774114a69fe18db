// libcurl, loaded when the first request is made instead of linked: the node agent's plugin and
// exporter never talk to the API server, and linking libcurl mapped ~25 libraries into every
// gpulet process (TLS, Kerberos, LDAP, SSH, IDN, …, about 3.5 MiB resident). The types and
// constants still come from <curl/curl.h>; only the calls go through this table.
#pragma once

#include <curl/curl.h>

#include <string>

namespace gpulet::k8s {

struct CurlLibrary {
  CURLcode (*global_init)(long flags);
  CURL* (*easy_init)();
  CURLcode (*easy_setopt)(CURL* handle, CURLoption option, ...);
  CURLcode (*easy_perform)(CURL* handle);
  CURLcode (*easy_getinfo)(CURL* handle, CURLINFO info, ...);
  void (*easy_cleanup)(CURL* handle);
  void (*easy_reset)(CURL* handle);
  const char* (*easy_strerror)(CURLcode code);
  curl_slist* (*slist_append)(curl_slist* list, const char* text);
  void (*slist_free_all)(curl_slist* list);
};

// The table, loaded (and curl_global_init run) once, thread-safely, on first use; null when
// libcurl.so.4 or one of its functions cannot be found (CurlLoadError says why).
const CurlLibrary* Curl();
const std::string& CurlLoadError();

}  // namespace gpulet::k8s
