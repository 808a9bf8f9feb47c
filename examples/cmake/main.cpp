// count_samples — streams the shards named on the command line for one
// epoch with the C++ wrapper and prints what it read:
//
//   ringfeed 0.2.0: samples=301 bytes=6021483 batches=10
//
// The example of examples/cmake/CMakeLists.txt: find_package(ringfeed) and
// the imported target ringfeed::ringfeed, nothing from the source tree.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "ringfeed.hpp"

namespace {

// `s` as a JSON string literal (paths with quotes or backslashes too).
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
    }
    out += c;
  }
  return out + "\"";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s SHARD...\n", argv[0]);
    return 2;
  }
  std::string urls;
  for (int i = 1; i < argc; i++) {
    urls += (i > 1 ? "," : "") + json_string(argv[i]);
  }
  const std::string config = "{\"urls\": [" + urls + "], \"batch_size\": 32, \"epochs\": 1}";
  try {
    ringfeed::Loader loader(config);
    std::uint64_t samples = 0, bytes = 0, batches = 0;
    for (;;) {
      ringfeed::Next next = loader.next(std::chrono::seconds(60));
      if (next) {
        batches++;
        samples += next->size();
        bytes += next->bytes();
      } else if (next.finished()) {
        break;
      } else if (next.timed_out()) {
        std::fprintf(stderr, "no batch within 60 s\n");
        return 1;
      }
    }
    std::printf("ringfeed %s: samples=%llu bytes=%llu batches=%llu\n",
                std::string(ringfeed::version()).c_str(),
                static_cast<unsigned long long>(samples),
                static_cast<unsigned long long>(bytes),
                static_cast<unsigned long long>(batches));
  } catch (const ringfeed::Error& e) {
    std::fprintf(stderr, "ringfeed: %s\n", e.what());
    return 1;
  }
  return 0;
}
