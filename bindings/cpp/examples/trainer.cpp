// trainer.cpp — the shape of a training loop on ringfeed's C++ wrapper.
//
// Streams WebDataset shards for some epochs and stands in for the training
// step by reading every byte of every field (a byte sum, so no read can be
// optimized away), then prints per-epoch totals and the loader's stats.
//
//   cargo build --release --lib
//   c++ -std=c++17 -O2 -I include -I bindings/cpp bindings/cpp/examples/trainer.cpp
//       -L target/release -lringfeed -Wl,-rpath,target/release -o trainer
//   (one command line)
//   ./trainer --epochs 2 --memory-budget 1GiB 'shards/shard-{000000..000127}.tar'
//
// Options: --epochs N, --batch-size N, --memory-budget SIZE, --chunk-size
// SIZE, --io-backend auto|io_uring|threads, and --extra-json '"key": value, ...'
// for any other configuration key. The rest of the arguments are dataset URLs.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "ringfeed.hpp"

namespace {

// `s` as a JSON string literal.
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char esc[8];
      unsigned code = static_cast<unsigned char>(c);
      std::snprintf(esc, sizeof esc, "\\u%04x", code);
      out += esc;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

struct EpochTotals {
  std::uint64_t batches = 0;
  std::uint64_t samples = 0;
  std::uint64_t bytes = 0;
  std::uint64_t byte_sum = 0;
};

int usage(const char* argv0) {
  std::cerr << "usage: " << argv0
            << " [--epochs N] [--batch-size N] [--memory-budget SIZE] [--chunk-size SIZE]"
               " [--io-backend auto|io_uring|threads] [--extra-json MEMBERS] URL...\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> urls;
  std::string members;  // configuration members other than "urls"
  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (arg == "--epochs" || arg == "--batch-size") {
      std::string v = value();
      if (v.empty()) return usage(argv[0]);
      members += ", " + json_string(arg == "--epochs" ? "epochs" : "batch_size") + ": " + v;
    } else if (arg == "--memory-budget" || arg == "--chunk-size" || arg == "--io-backend") {
      std::string v = value();
      if (v.empty()) return usage(argv[0]);
      std::string key = arg == "--memory-budget" ? "memory_budget"
                        : arg == "--chunk-size"  ? "chunk_size"
                                                 : "io_backend";
      members += ", " + json_string(key) + ": " + json_string(v);
    } else if (arg == "--extra-json") {
      std::string v = value();
      if (v.empty()) return usage(argv[0]);
      members += ", " + v;
    } else if (arg.rfind("--", 0) == 0) {
      return usage(argv[0]);
    } else {
      urls.push_back(arg);
    }
  }
  if (urls.empty()) return usage(argv[0]);
  std::string config = "{\"urls\": [";
  for (std::size_t i = 0; i < urls.size(); i++) {
    config += (i ? ", " : "") + json_string(urls[i]);
  }
  config += "]" + members + "}";

  try {
    ringfeed::Loader loader(config);
    std::uint64_t epoch = 0;
    EpochTotals totals;
    std::uint64_t timeouts = 0;
    for (;;) {
      // A time-out lets a real trainer notice a stalled input pipeline
      // (here it is only counted) instead of blocking for ever.
      ringfeed::Next next = loader.next(std::chrono::seconds(10));
      if (next) {
        // The lease is released when `next` goes out of scope, at the end
        // of this iteration: the "training step" must be done with the bytes.
        const ringfeed::Batch& batch = *next;
        totals.batches++;
        for (ringfeed::Sample sample : batch) {
          totals.samples++;
          for (ringfeed::Field field : sample) {
            totals.bytes += field.size();
            for (std::uint8_t byte : field.data()) {
              totals.byte_sum += byte;
            }
          }
        }
      } else if (next.timed_out()) {
        timeouts++;
      } else if (next.end_of_epoch()) {
        std::printf("epoch %llu: samples=%llu bytes=%llu byte_sum=%llu batches=%llu\n",
                    static_cast<unsigned long long>(epoch),
                    static_cast<unsigned long long>(totals.samples),
                    static_cast<unsigned long long>(totals.bytes),
                    static_cast<unsigned long long>(totals.byte_sum),
                    static_cast<unsigned long long>(totals.batches));
        std::fflush(stdout);
        epoch++;
        totals = EpochTotals{};
      } else if (next.finished()) {
        break;
      }
    }
    ringfeed::Stats s = loader.stats();
    std::printf(
        "stats: samples_delivered=%llu bytes_delivered=%llu batches_delivered=%llu "
        "bytes_read=%llu bytes_copied=%llu workers=%u memory_kind=%d io_backend=%d "
        "memory_locked=%u buffers_registered=%u consumer_wait_ms=%.1f timeouts=%llu\n",
        static_cast<unsigned long long>(s.samples_delivered),
        static_cast<unsigned long long>(s.bytes_delivered),
        static_cast<unsigned long long>(s.batches_delivered),
        static_cast<unsigned long long>(s.bytes_read),
        static_cast<unsigned long long>(s.bytes_copied), s.workers, s.memory_kind, s.io_backend,
        s.memory_locked, s.buffers_registered, static_cast<double>(s.consumer_wait_ns) / 1e6,
        static_cast<unsigned long long>(timeouts));
    std::printf("stats json: %s\n", loader.stats_json().c_str());
    loader.close();
  } catch (const ringfeed::Error& e) {
    std::fprintf(stderr, "trainer: %s\n", e.what());
    return 1;
  }
  return 0;
}
