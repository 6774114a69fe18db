// Fuzzing the HTTP server's request handling (issue 35).
//
// LLVMFuzzerTestOneInput frames an input as the server does: request heads parsed one after the
// other (ParseRequestHead: Boost.Beast's grammar and our checks), each body skipped by its
// Content-Length, and checks what the server relies on: a head is consumed whole, within the
// header limit, and a refused input consumes nothing. With clang it links into libFuzzer
// (-fsanitize=fuzzer); the deterministic driver (fuzz_driver.cc) runs it everywhere, and also
// sends mutated inputs to a live server, which must still answer /health afterwards.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "metrics/http_server.h"

// Heads parsed whole, over all inputs: how much of the corpus gets past the grammar.
size_t fuzz_heads_complete = 0;

namespace {
constexpr size_t kMaxHeaderBytes = 8192;

void Check(bool ok) {
  if (!ok) std::abort();  // libFuzzer and the driver both report an abort as a finding
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  for (int requests = 0; requests < 1000 && !in.empty(); ++requests) {
    gpulet::metrics::RequestHead head;
    size_t used = 0;
    const auto r = gpulet::metrics::ParseRequestHead(in, kMaxHeaderBytes, &head, &used);
    if (r != gpulet::metrics::HeadParse::kComplete) {
      Check(r != gpulet::metrics::HeadParse::kIncomplete || in.size() <= kMaxHeaderBytes);
      break;
    }
    ++fuzz_heads_complete;
    Check(used > 0 && used <= in.size() && used <= kMaxHeaderBytes);
    Check(!head.method.empty());
    Check(head.has_body == (head.chunked || head.content_length > 0));
    in.remove_prefix(used);
    if (head.chunked) break;  // the server refuses it (411/413) and closes
    if (head.content_length > in.size()) break;
    in.remove_prefix(head.content_length);
  }
  return 0;
}
