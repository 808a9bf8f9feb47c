// wrapper_test.cpp — the C++ wrapper (bindings/cpp/ringfeed.hpp) on real
// shards: iteration over samples and fields with the generator's bytes,
// leases released exactly once by RAII or release(), moves of leases and
// loaders, exceptions with the library's message, a batch outliving its
// loader, and close() while another thread waits in next().
//
// Usage: wrapper_test SEED SAMPLES BYTES SHARD...   (as abi_stream)
//        wrapper_test --node SOCKET SEED SAMPLES BYTES SHARD...
//          (a consumer attached to the node engine at SOCKET, whose
//          `batch_size` is 7: every sample once, leases that outlive the
//          loader, the engine named in the stats)

#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "cpp_check.h"
#include "ringfeed.hpp"
#include "synth_check.h"

#ifndef RINGFEED_EXPECTED_VERSION
#error "build with -DRINGFEED_EXPECTED_VERSION=\"x.y.z\" (the crate's version)"
#endif

namespace {

std::uint64_t seed, n_samples, n_bytes;
std::vector<std::string> shards;

static_assert(!std::is_copy_constructible_v<ringfeed::Loader>, "Loader is move-only");
static_assert(!std::is_copy_assignable_v<ringfeed::Loader>, "Loader is move-only");
static_assert(std::is_nothrow_move_constructible_v<ringfeed::Loader>, "");
static_assert(std::is_nothrow_move_assignable_v<ringfeed::Loader>, "");
static_assert(!std::is_copy_constructible_v<ringfeed::Batch>, "Batch is move-only");
static_assert(!std::is_copy_assignable_v<ringfeed::Batch>, "Batch is move-only");
static_assert(std::is_nothrow_move_constructible_v<ringfeed::Batch>, "vector<Batch> moves");
static_assert(std::is_nothrow_move_assignable_v<ringfeed::Batch>, "");
static_assert(std::is_base_of_v<std::runtime_error, ringfeed::Error>, "");
static_assert(std::is_nothrow_copy_constructible_v<ringfeed::Error>, "exceptions copy safely");

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string config(const std::vector<std::string>& urls, const std::string& extra) {
  std::string c = "{\"urls\": [";
  for (std::size_t i = 0; i < urls.size(); i++) c += (i ? ", " : "") + json_string(urls[i]);
  c += "], \"memory_budget\": \"64MiB\", \"chunk_size\": \"1MiB\"";
  if (!extra.empty()) c += ", " + extra;
  return c + "}";
}

// A loader whose workers starve once a few batches are held: 1 MiB of
// memory over megabytes of shards.
std::string starving_config() {
  std::string c = "{\"urls\": [";
  for (std::size_t i = 0; i < shards.size(); i++) c += (i ? ", " : "") + json_string(shards[i]);
  return c +
         "], \"memory_budget\": \"1MiB\", \"chunk_size\": \"64KiB\", \"workers\": 1, "
         "\"batch_size\": 4}";
}

// Checks a held batch through the wrapper's views; returns its keys.
std::vector<std::string> check_batch(const ringfeed::Batch& batch) {
  CHECK(batch.valid() && batch.size() > 0, "an empty batch was delivered");
  std::vector<std::string> keys;
  std::uint64_t bytes = 0;
  std::size_t i = 0;
  for (ringfeed::Sample sample : batch) {
    CHECK(sample.key() == batch[i].key(), "iteration and operator[] disagree");
    i++;
    std::string key(sample.key());
    std::uint64_t parsed;
    CHECK(synth_parse_key(key.c_str(), &parsed), "not a synth key: " + key);
    CHECK(std::distance(sample.begin(), sample.end()) == 2 && sample.size() == 2,
          key + ": not 2 fields");
    for (ringfeed::Field field : sample) {
      std::string name(field.name());
      CHECK(name == "jpg" || name == "cls", key + ": field " + name);
      ringfeed::Bytes data = field.data();
      CHECK(data.size() == field.size() && data.end() - data.begin() ==
                                               static_cast<std::ptrdiff_t>(data.size()),
            key + ": Bytes size");
      CHECK(synth_verify(seed, key.c_str(), name.c_str(), data.data(), data.size()),
            key + "." + name + ": bytes differ from what was written");
      bytes += data.size();
    }
    auto jpg = sample.field("jpg");
    CHECK(jpg && jpg->name() == "jpg" && jpg->data().data() == sample[0].data().data(),
          key + ": field(\"jpg\") is not the first field");
    CHECK(!sample.field("png"), key + ": field(\"png\") found");
    keys.push_back(key);
  }
  CHECK(bytes == batch.bytes(), "batch bytes() differs from its fields");
  return keys;
}

void version_matches() {
  CHECK(ringfeed::version() == RINGFEED_EXPECTED_VERSION,
        "version " + std::string(ringfeed::version()));
}

void errors_are_exceptions_with_messages() {
  std::printf("exceptions:\n");
  EXPECT_THROWS(ringfeed::Loader l("{\"urls\": \"a.tar\", \"bogus_key\": 1}"),
                RINGFEED_ERR_CONFIG, "bogus_key");
  EXPECT_THROWS(ringfeed::Loader l(std::string("{not json")), RINGFEED_ERR_CONFIG,
                "not valid JSON");
  EXPECT_THROWS(ringfeed::Loader l("{\"urls\": \"\xff\"}"), RINGFEED_ERR_INVALID_ARGUMENT,
                "UTF-8");
  EXPECT_THROWS(ringfeed::Loader l(static_cast<const char*>(nullptr)),
                RINGFEED_ERR_INVALID_ARGUMENT, "config_json");
  std::string missing = shards[0] + ".missing.tar";
  EXPECT_THROWS(ringfeed::Loader l(config({missing}, "")), RINGFEED_ERR_DATASET, missing);

  // A corrupt shard fails in next(), and keeps failing.
  std::string garbage = shards[0] + ".garbage";
  {
    std::ofstream out(garbage, std::ios::binary);
    for (int i = 0; i < 4096; i++) out.put(static_cast<char>(0x5a));
  }
  ringfeed::Loader loader(config({garbage}, ""));
  EXPECT_THROWS(while (loader.next()) {}, RINGFEED_ERR_FORMAT, garbage);
  EXPECT_THROWS(loader.next(std::chrono::milliseconds(0)), RINGFEED_ERR_FORMAT, "byte 0");
  std::remove(garbage.c_str());
}

void iterates_every_sample_once() {
  ringfeed::Loader loader(config(shards, "\"batch_size\": 6, \"epochs\": 2"));
  for (std::uint64_t epoch = 0; epoch < 2; epoch++) {
    std::set<std::string> keys;
    std::uint64_t bytes = 0;
    for (;;) {
      ringfeed::Next next = loader.next(std::chrono::seconds(60));
      CHECK(!next.timed_out(), "no batch within a minute");
      if (next.end_of_epoch()) break;
      CHECK(next.has_value() && next.kind() == ringfeed::Next::Kind::batch,
            "finished before the end of epoch " + std::to_string(epoch));
      CHECK(next->epoch() == epoch, "batch of epoch " + std::to_string(next->epoch()));
      for (const std::string& k : check_batch(*next)) {
        CHECK(keys.insert(k).second, "delivered twice in one epoch: " + k);
      }
      bytes += next->bytes();
    }
    CHECK(keys.size() == n_samples, "epoch " + std::to_string(epoch) + ": " +
                                        std::to_string(keys.size()) + " samples of " +
                                        std::to_string(n_samples));
    CHECK(bytes == n_bytes, "epoch " + std::to_string(epoch) + ": bytes");
  }
  ringfeed::Next done = loader.next(std::chrono::milliseconds(0));
  for (int i = 0; i < 1000 && done.timed_out(); i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    done = loader.next(std::chrono::milliseconds(0));
  }
  CHECK(done.finished() && !done && !done->valid(), "not finished after the last epoch");
  bool threw = false;
  try {
    done.value();
  } catch (const std::bad_optional_access&) {
    threw = true;
  }
  CHECK(threw, "value() of a finished Next did not throw bad_optional_access");
  CHECK(loader.next().finished(), "finished is not sticky");

  ringfeed::Stats s = loader.stats();
  CHECK(s.samples_delivered == 2 * n_samples && s.bytes_delivered == 2 * n_bytes &&
            s.epochs_done == 2,
        "stats after two epochs");
  std::string json = loader.stats_json();
  CHECK(json.size() > 2 && json.front() == '{' && json.back() == '}' &&
            json.find("\"samples_delivered\":" + std::to_string(2 * n_samples)) !=
                std::string::npos,
        "stats_json: " + json);
}

// True when the C library no longer holds this lease.
bool is_released(ringfeed_batch copy) {
  return ringfeed_batch_release(&copy) == RINGFEED_ERR_INVALID_HANDLE;
}

void leases_release_once_and_move() {
  ringfeed::Loader loader(config(shards, "\"batch_size\": 3"));

  // RAII: the lease ends with its scope, released exactly once.
  ringfeed_batch copy;
  {
    ringfeed::Next next = loader.next();
    CHECK(next.has_value(), "no first batch");
    copy = next->raw();
    CHECK(copy.handle != 0, "a held batch with handle 0");
  }
  CHECK(is_released(copy), "the batch was not released when its Batch was destroyed");

  // Explicit release(); a second release() does nothing.
  ringfeed::Batch b = loader.next().value();
  copy = b.raw();
  check_batch(b);
  b.release();
  CHECK(!b.valid() && !b && b.size() == 0 && b.raw().handle == 0, "release() left a lease");
  b.release();
  CHECK(is_released(copy), "release() did not release");

  // Moves hand the lease over; views stay valid; the source is empty.
  ringfeed::Batch a = loader.next().value();
  ringfeed::Sample first = a[0];
  std::string first_key(first.key());
  std::uint64_t handle = a.raw().handle;
  ringfeed::Batch moved(std::move(a));
  CHECK(!a.valid() && a.raw().handle == 0 && a.begin() == a.end(),
        "moved-from batch holds a lease");
  CHECK(moved.raw().handle == handle, "the move lost the lease");
  CHECK(first.key() == first_key, "a view changed when its batch moved");
  check_batch(moved);

  ringfeed::Batch target = loader.next().value();
  ringfeed_batch target_copy = target.raw();
  target = std::move(moved);
  CHECK(is_released(target_copy), "move assignment did not release the lease it replaced");
  CHECK(target.raw().handle == handle && !moved.valid(), "move assignment lost the lease");
  ringfeed::Batch& alias = target;
  target = std::move(alias);
  CHECK(target.raw().handle == handle, "self-move assignment dropped the lease");
  check_batch(target);

  // Many leases in a vector survive its reallocations and end with clear().
  std::vector<ringfeed::Batch> held;
  std::vector<ringfeed_batch> copies;
  for (int i = 0; i < 12; i++) {
    held.push_back(loader.next().value());
    copies.push_back(held.back().raw());
  }
  for (const ringfeed::Batch& h : held) check_batch(h);
  held.clear();
  for (const ringfeed_batch& c : copies) CHECK(is_released(c), "clear() left a lease");
}

void batch_outlives_loader() {
  ringfeed::Batch kept;
  ringfeed_batch copy;
  {
    ringfeed::Loader loader(config(shards, "\"batch_size\": 5"));
    kept = loader.next().value();
    copy = kept.raw();
  }
  CHECK(kept.valid(), "closing the loader took the lease");
  check_batch(kept);
  kept.release();
  CHECK(is_released(copy), "not released");
}

void loaders_move() {
  ringfeed::Loader a(config(shards, ""));
  ringfeed_loader* handle = a.get();
  ringfeed::Loader b(std::move(a));
  CHECK(!a && a.get() == nullptr && b.get() == handle, "the move did not hand the loader over");
  EXPECT_THROWS(a.next(std::chrono::milliseconds(0)), RINGFEED_ERR_INVALID_ARGUMENT, "loader");
  a.close();  // closing an empty loader does nothing

  ringfeed::Loader c(config(shards, ""));
  ringfeed_loader* replaced = c.get();
  c = std::move(b);
  ringfeed_stats s;
  s.size = sizeof s;
  CHECK(ringfeed_loader_stats(replaced, &s) == RINGFEED_ERR_INVALID_HANDLE,
        "move assignment did not close the loader it replaced");
  CHECK(c.get() == handle, "move assignment lost the loader");
  std::uint64_t samples = 0;
  for (;;) {
    ringfeed::Next next = c.next();
    if (!next) {
      CHECK(next.end_of_epoch(), "the epoch did not end");
      break;
    }
    samples += next->size();
  }
  CHECK(samples == n_samples, "a moved loader delivered " + std::to_string(samples));
}

void close_while_another_thread_waits() {
  std::printf("close while waiting:\n");
  ringfeed::Loader loader(starving_config());
  std::vector<ringfeed::Batch> held;
  for (;;) {
    ringfeed::Next next = loader.next(std::chrono::milliseconds(50));
    if (next.timed_out()) break;
    CHECK(next.has_value(), "a starved loader did not time out");
    held.push_back(std::move(*next));
  }
  std::int32_t status = RINGFEED_OK;
  std::string message;
  std::thread waiter([&] {
    // A batch that trickled in is held too, so the loader stays starved; the
    // leases end with the thread, after the close.
    std::vector<ringfeed::Batch> mine;
    try {
      for (;;) {
        ringfeed::Next n = loader.next();  // for ever, until the close
        if (n) mine.push_back(std::move(*n));
      }
    } catch (const ringfeed::Error& e) {
      status = e.status();
      message = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  loader.close();
  waiter.join();
  CHECK(status == RINGFEED_ERR_CLOSED || status == RINGFEED_ERR_INVALID_HANDLE,
        "the waiting thread got " + message);
  std::printf("  waiter: %s\n", message.c_str());
  EXPECT_THROWS(loader.next(std::chrono::milliseconds(0)), RINGFEED_ERR_INVALID_HANDLE,
                "loader handle");
  EXPECT_THROWS(loader.stats(), RINGFEED_ERR_INVALID_HANDLE, "loader handle");
  EXPECT_THROWS(loader.stats_json(), RINGFEED_ERR_INVALID_HANDLE, "loader handle");
  loader.close();  // again: nothing

  for (const ringfeed::Batch& h : held) check_batch(h);
  held.clear();

  // Destroying a closed Loader does not close it again: this thread's last
  // error stays the one set here.
  {
    ringfeed::Loader closed(config(shards, ""));
    closed.close();
    EXPECT_THROWS(ringfeed::Loader l("{\"urls\": \"a\", \"__marker__\": 1}"), RINGFEED_ERR_CONFIG,
                  "__marker__");
  }
  CHECK(ringfeed::detail::last_error().find("__marker__") != std::string::npos,
        "~Loader closed a closed loader again: " + ringfeed::detail::last_error());
}

// state() round-trips: a loader reopened with it delivers the rest of the
// epoch in the uninterrupted order.
void state_resumes_the_epoch() {
  std::printf("state:\n");
  const std::string extra = "\"batch_size\": 4, \"shuffle\": true, \"shuffle_buffer\": 16, \"seed\": 3";
  auto keys_of = [](ringfeed::Loader& l, std::size_t limit) {
    std::vector<std::string> keys;
    for (std::size_t n = 0; n < limit; n++) {
      ringfeed::Next next = l.next();
      if (!next) break;
      for (ringfeed::Sample s : *next) keys.emplace_back(s.key());
    }
    return keys;
  };
  ringfeed::Loader whole(config(shards, extra));
  std::vector<std::string> all = keys_of(whole, SIZE_MAX);
  ringfeed::Loader cut(config(shards, extra));
  std::vector<std::string> again = keys_of(cut, 5);
  std::string state = cut.state();
  CHECK(!state.empty() && state.find('"') == std::string::npos, "state: " + state);
  cut.close();
  EXPECT_THROWS(cut.state(), RINGFEED_ERR_INVALID_HANDLE, "loader handle");
  ringfeed::Loader resumed(config(shards, extra + ", \"resume\": \"" + state + "\""));
  std::vector<std::string> rest = keys_of(resumed, SIZE_MAX);
  again.insert(again.end(), rest.begin(), rest.end());
  CHECK(again == all, "the resumed epoch differs from the uninterrupted one");
  std::printf("  %zu samples, cut after 5 batches, resumed in order\n", all.size());
}

void node_consumer(const std::string& socket) {
  ringfeed::Batch kept;
  std::set<std::string> keys;
  std::uint64_t bytes = 0;
  {
    ringfeed::Loader loader(config(shards, "\"batch_size\": 7, \"node\": " + json_string(socket)));
    for (ringfeed::Batch batch = loader.next().value(); batch.valid();) {
      CHECK(batch.size() <= 7, "a batch over the engine's batch_size");
      for (const std::string& k : check_batch(batch)) {
        CHECK(keys.insert(k).second, "delivered twice: " + k);
      }
      bytes += batch.bytes();
      ringfeed::Next next = loader.next(std::chrono::seconds(60));
      CHECK(!next.timed_out(), "no batch within a minute");
      if (!kept.valid()) {
        kept = std::move(batch);  // held past close, in the engine's arena
      }
      if (next.end_of_epoch()) next = loader.next(std::chrono::seconds(60));
      if (next.finished()) break;
      batch = std::move(next.value());
    }
    std::string json = loader.stats_json();
    CHECK(json.find("\"node\":{") != std::string::npos &&
              json.find(json_string(socket)) != std::string::npos,
          "stats_json names no node engine: " + json);
  }
  CHECK(keys.size() == n_samples && bytes == n_bytes,
        std::to_string(keys.size()) + " samples of " + std::to_string(n_samples));
  CHECK(kept.valid(), "closing the loader took the lease");
  check_batch(kept);
  kept.release();
  std::printf("  %zu samples through the node engine at %s\n", keys.size(), socket.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  alarm(240);  // a hang is a failure
  std::string node;
  if (argc > 2 && std::string(argv[1]) == "--node") {
    node = argv[2];
    argv += 2;
    argc -= 2;
  }
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s [--node SOCKET] SEED SAMPLES BYTES SHARD...\n", argv[0]);
    return 2;
  }
  seed = std::strtoull(argv[1], nullptr, 10);
  n_samples = std::strtoull(argv[2], nullptr, 10);
  n_bytes = std::strtoull(argv[3], nullptr, 10);
  shards.assign(argv + 4, argv + argc);

  if (!node.empty()) {
    node_consumer(node);
    std::printf("wrapper_test: all checks passed\n");
    return 0;
  }
  version_matches();
  errors_are_exceptions_with_messages();
  iterates_every_sample_once();
  leases_release_once_and_move();
  batch_outlives_loader();
  loaders_move();
  close_while_another_thread_waits();
  state_resumes_the_epoch();
  std::printf("wrapper_test: all checks passed\n");
  return 0;
}
