// A deterministic mutation fuzzer for what the API client reads from the network: the HTTP/1.1
// answer (status line, headers, Content-Length, chunked and close-delimited bodies, 1xx answers),
// the watch stream's line framing, and the JSON of each line or body as the client decodes it.
// Inputs are mutations of a seed corpus of answers (bit flips, byte runs, inserted protocol tokens,
// splices, truncations), each read through k8s::http::Exchange from memory in pieces of random
// size, under random body bounds. No coverage feedback (the product builds with GCC, whose
// coverage hooks libFuzzer does not read); the seeds name every framing the parser has.
//
// What must hold for every input: no memory error (run under ASan/UBSan in build-san), and
//   - a body delivered with Content-Length has exactly that many bytes;
//   - no body over ExchangeOptions::max_body_bytes is delivered whole;
//   - the line splitter gives back exactly the bytes it was fed, newline for newline, keeps no
//     line over its bound, and refuses the stream once one outgrew it.
// A violation prints the input (as C escapes) and aborts.
//
// usage: k8s_client_fuzz [--iterations N] [--seconds S] [--seed N]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "k8s/client.h"
#include "k8s/http.h"
#include "k8s/watch.h"

namespace {

using gpulet::k8s::http::Clock;
namespace http = gpulet::k8s::http;

// Reads `bytes` in pieces whose sizes come from `rng`; writes go nowhere.
class MemoryStream final : public http::Stream {
 public:
  MemoryStream(std::string_view bytes, std::mt19937_64& rng) : bytes_(bytes), rng_(rng) {}
  gpulet::Status WriteAll(std::string_view, Clock::time_point) override {
    return gpulet::Status::Ok();
  }
  gpulet::Result<size_t> ReadSome(char* buf, size_t cap, Clock::time_point,
                                  const std::atomic<bool>*) override {
    if (pos_ >= bytes_.size()) return size_t{0};
    const size_t piece = (rng_() % 4 == 0) ? 1 + rng_() % 7 : 1 + rng_() % 4096;
    const size_t n = std::min({cap, bytes_.size() - pos_, piece});
    std::memcpy(buf, bytes_.data() + pos_, n);
    pos_ += n;
    return n;
  }

 private:
  std::string_view bytes_;
  size_t pos_ = 0;
  std::mt19937_64& rng_;
};

std::vector<std::string> Seeds() {
  const std::string event =
      R"({"type":"ADDED","object":{"kind":"Node","metadata":{"name":"n1","resourceVersion":"7"}}})";
  const std::string list =
      R"({"kind":"NodeList","metadata":{"resourceVersion":"9"},"items":[{"metadata":{"name":"a"}},)"
      R"({"metadata":{"name":"b","labels":{"x":"y"}}}]})";
  const std::string status =
      R"({"kind":"Status","apiVersion":"v1","status":"Failure","message":"gone","code":410})";
  auto cl = [](const std::string& body) {
    return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body;
  };
  auto chunk = [](const std::string& b) {
    char n[32];
    std::snprintf(n, sizeof n, "%zx\r\n", b.size());
    return n + b + "\r\n";
  };
  const std::string chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
  return {
      cl(list),
      cl(status),
      "HTTP/1.1 410 Gone\r\nContent-Length: " + std::to_string(status.size()) + "\r\n\r\n" + status,
      chunked + chunk(event + "\n") + chunk(event.substr(0, 20)) + chunk(event.substr(20) + "\r\n") +
          "0\r\n\r\n",
      chunked + chunk(event + "\n" + event + "\n") + "0;ext=1\r\nTrailer: x\r\n\r\n",
      "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}",
      "HTTP/1.0 200 OK\r\n\r\n" + list,
      "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 3\r\nConnection: close\r\n"
      "Content-Length: 2\r\n\r\n{}",
      "HTTP/1.1 204 No Content\r\n\r\n",
      chunked + chunk("{\"type\":\"BOOKMARK\",\"object\":{\"metadata\":{\"resourceVersion\":\"12\"}}}\n"),
  };
}

const char* const kTokens[] = {
    "\r\n", "\n", "\r\n\r\n", "0\r\n\r\n", ":", " ", "\t", "Content-Length: ",
    "Transfer-Encoding: chunked\r\n", "Connection: close\r\n", "ffffffffffffffff", "7fffffff",
    "18446744073709551616", "-1", "HTTP/1.1 100 Continue\r\n\r\n", "{", "}", "[", "]", "\"",
    "\\u0000", "\\ud800", "1e999999", "{\"type\":\"ERROR\",\"object\":{\"code\":410}}\n", ";ext",
};

std::string Mutate(std::string s, const std::vector<std::string>& seeds, std::mt19937_64& rng) {
  const int rounds = 1 + static_cast<int>(rng() % 6);
  for (int r = 0; r < rounds; ++r) {
    const size_t at = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 8) {
      case 0:  // flip a bit
        if (!s.empty()) s[at % s.size()] = static_cast<char>(s[at % s.size()] ^ (1 << (rng() % 8)));
        break;
      case 1:  // a random byte
        if (!s.empty()) s[at % s.size()] = static_cast<char>(rng());
        break;
      case 2:  // insert a token
        s.insert(at, kTokens[rng() % (sizeof kTokens / sizeof kTokens[0])]);
        break;
      case 3:  // erase a run
        if (!s.empty()) s.erase(at % s.size(), 1 + rng() % 16);
        break;
      case 4:  // truncate
        s.resize(at);
        break;
      case 5: {  // splice another seed's tail
        const std::string& other = seeds[rng() % seeds.size()];
        s = s.substr(0, at) + other.substr(rng() % (other.size() + 1));
        break;
      }
      case 6:  // a run of one byte (long lines, long numbers)
        s.insert(at, std::string(1 + rng() % 3000, "x0\n\r {"[rng() % 6]));
        break;
      default:  // duplicate a piece
        if (!s.empty()) {
          const size_t from = rng() % s.size();
          s.insert(at, s.substr(from, 1 + rng() % 64));
        }
        break;
    }
  }
  return s;
}

std::string Escaped(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '"') {
      out.push_back(static_cast<char>(c));
    } else {
      char e[8];
      std::snprintf(e, sizeof e, "\\x%02x", c);
      out += e;
    }
  }
  return out;
}

[[noreturn]] void Violation(const char* what, std::string_view input) {
  std::fprintf(stderr, "k8s_client_fuzz: %s\ninput: \"%s\"\n", what, Escaped(input).c_str());
  std::abort();
}

// One input through the client's reading path; aborts on a broken invariant.
void RunOne(const std::string& input, std::mt19937_64& rng) {
  MemoryStream stream(input, rng);
  http::Endpoint endpoint;
  endpoint.host = "api.example.test";
  endpoint.host_header = endpoint.host;
  http::Request request;
  request.method = rng() % 4 == 0 ? "POST" : "GET";
  request.target = "/api/v1/nodes?watch=1";
  http::ExchangeOptions options;
  const size_t bounds[] = {0, 64, 4096, gpulet::k8s::kMaxObjectAnswerBytes};
  options.max_body_bytes = bounds[rng() % 4];
  const size_t max_line = rng() % 2 == 0 ? 256 : gpulet::k8s::kMaxWatchLineBytes;
  http::LineSplitter lines(max_line);
  std::string body, framed;
  bool overflow_seen = false;
  http::ResponseHead head;
  const std::optional<http::ExchangeError> error = http::Exchange(
      stream, endpoint, request, options, head, [&](const http::ResponseHead&, std::string_view b) {
        body.append(b);
        const bool fed = lines.Feed(b, [&](std::string_view line) {
          if (line.size() > max_line) Violation("a line over the splitter's bound", input);
          framed.append(line);
          framed.push_back('\n');
          nlohmann::json j = nlohmann::json::parse(line, nullptr, false);  // as Client::Watch
          if (j.is_object()) {
            nlohmann::json object = j.value("object", nlohmann::json());
            (void)object.is_object();
          }
          return true;
        });
        if (!fed) overflow_seen = true;
        if (lines.overflowed() != overflow_seen) Violation("overflow not reported", input);
        return !overflow_seen;
      });
  if (!error) {
    if (options.max_body_bytes > 0 && body.size() > options.max_body_bytes)
      Violation("a body over max_body_bytes delivered whole", input);
    if (head.content_length >= 0 && static_cast<size_t>(head.content_length) != body.size() &&
        request.method != "HEAD" && head.status != 204 && head.status != 304)
      Violation("Content-Length and the delivered body differ", input);
  }
  if (!overflow_seen) {
    // What the splitter handed out, with what it still holds, is what it was fed (CRs before a
    // newline dropped).
    std::string fed;
    for (size_t i = 0; i < body.size(); ++i) {
      if (body[i] == '\r' && i + 1 < body.size() && body[i + 1] == '\n') continue;
      fed.push_back(body[i]);
    }
    if (framed + std::string(lines.rest()) != fed) Violation("lines lost or changed", input);
  }
  nlohmann::json whole = nlohmann::json::parse(body, nullptr, false);  // as Client::Get
  std::vector<nlohmann::json> items = gpulet::k8s::ItemsOf(std::move(whole));
  (void)items.size();
}

}  // namespace

int main(int argc, char** argv) {
  long iterations = -1;
  double seconds = -1;
  unsigned long long seed = 35;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--iterations") iterations = std::atol(argv[i + 1]);
    else if (flag == "--seconds") seconds = std::atof(argv[i + 1]);
    else if (flag == "--seed") seed = std::strtoull(argv[i + 1], nullptr, 10);
    else {
      std::fprintf(stderr, "usage: %s [--iterations N] [--seconds S] [--seed N]\n", argv[0]);
      return 2;
    }
  }
  if (iterations < 0 && seconds < 0) iterations = 100000;
  const std::vector<std::string> seeds = Seeds();
  std::mt19937_64 rng(seed);
  const auto start = std::chrono::steady_clock::now();
  long done = 0;
  for (const std::string& s : seeds) {  // the seeds themselves first
    RunOne(s, rng);
    ++done;
  }
  for (;; ++done) {
    if (iterations >= 0 && done >= iterations) break;
    if (seconds >= 0 && (done & 255) == 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >= seconds)
      break;
    RunOne(Mutate(seeds[rng() % seeds.size()], seeds, rng), rng);
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("executions=%ld seconds=%.2f per_second=%.0f seed=%llu violations=0\n", done, took,
              done / took, seed);
  return 0;
}
