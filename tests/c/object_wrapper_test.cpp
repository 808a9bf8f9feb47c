// object_wrapper_test.cpp — the C++ wrapper's whole objects
// (bindings/cpp/ringfeed.hpp): Object read, iterated, moved and released
// exactly once; read_into and object_size; write_object refused over an
// existing object with RINGFEED_ERR_EXISTS; ObjectWriter written in pieces
// and finished, aborted by its destructor and by a move over it, and used
// after finish; on local files and, given an endpoint, on an S3 server.
//
// Usage: object_wrapper_test SCRATCH_DIR [ENDPOINT ACCESS_KEY SECRET_KEY BUCKET]

#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpp_check.h"
#include "ringfeed.hpp"

namespace {

static_assert(!std::is_copy_constructible_v<ringfeed::Object>, "Object is move-only");
static_assert(std::is_nothrow_move_constructible_v<ringfeed::Object>, "Object moves");
static_assert(!std::is_copy_constructible_v<ringfeed::ObjectWriter>, "ObjectWriter is move-only");
static_assert(std::is_nothrow_move_assignable_v<ringfeed::ObjectWriter>, "ObjectWriter moves");

std::vector<std::uint8_t> pattern(std::size_t n, std::uint32_t seed) {
  std::vector<std::uint8_t> v(n);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<std::uint8_t>(x);
  }
  return v;
}

bool same(const ringfeed::Object& o, const std::vector<std::uint8_t>& want) {
  return o.size() == want.size() && std::equal(o.begin(), o.end(), want.begin());
}

// Writes, reads back and refuses on `base`/... (a directory or s3://bucket).
void round_trips(const std::string& base, const std::string& config,
                 const std::string& overwrite, std::size_t big) {
  auto a = pattern(100003, 1);
  auto b = pattern(big, 2);
  const std::string one = base + "/one.bin", pieces = base + "/pieces.bin",
                    dropped = base + "/dropped.bin";

  ringfeed::write_object(one, a.data(), a.size(), config);
  EXPECT_THROWS(ringfeed::write_object(one, b.data(), 10, config), RINGFEED_ERR_EXISTS,
                "one.bin");
  {
    auto o = ringfeed::Object::read(one, config);
    CHECK(o && same(o, a), "the bytes read back differ");
    std::uint64_t sum = std::accumulate(o.begin(), o.end(), std::uint64_t{0});
    std::uint64_t want = std::accumulate(a.begin(), a.end(), std::uint64_t{0});
    CHECK(sum == want, "iteration does not see every byte");
    CHECK(o[5] == a[5] && o.bytes().size() == a.size(), "indexing and bytes()");
    // Moves carry the handle; the moved-from Object is empty.
    ringfeed::Object moved(std::move(o));
    CHECK(!o && o.size() == 0 && o.data() == nullptr, "a moved-from Object is not empty");
    CHECK(same(moved, a), "a moved Object lost its bytes");
    ringfeed::Object assigned;
    assigned = std::move(moved);
    CHECK(same(assigned, a), "a move-assigned Object lost its bytes");
    assigned.release();
    CHECK(!assigned, "a released Object is not empty");
    assigned.release();  // nothing on an empty Object
  }
  ringfeed::write_object(one, b.data(), 777, overwrite);
  CHECK(same(ringfeed::Object::read(one, config), std::vector<std::uint8_t>(b.begin(), b.begin() + 777)),
        "overwrite did not replace the object");

  // read_into: exact, the size query, too small.
  CHECK(ringfeed::object_size(one, config) == 777, "object_size");
  std::vector<std::uint8_t> buf(777);
  CHECK(ringfeed::read_into(one, buf.data(), buf.size(), config) == 777, "read_into's size");
  CHECK(std::equal(buf.begin(), buf.end(), b.begin()), "read_into's bytes");
  EXPECT_THROWS(ringfeed::read_into(one, buf.data(), 776, config), RINGFEED_ERR_BUFFER_TOO_SMALL,
                "777");

  // A writer in pieces.
  {
    ringfeed::ObjectWriter w(pieces, config);
    std::size_t off = 0, step = 3;
    while (off < b.size()) {
      std::size_t n = std::min(step, b.size() - off);
      w.write(b.data() + off, n);
      off += n;
      step = step * 5 + 11;
    }
    w.finish();
    CHECK(!w, "a finished writer is not empty");
    EXPECT_THROWS(w.write("x"), RINGFEED_ERR_INVALID_ARGUMENT, "writer");
    EXPECT_THROWS(w.finish(), RINGFEED_ERR_INVALID_ARGUMENT, "writer");
  }
  CHECK(same(ringfeed::Object::read(pieces, config), b), "the writer's object differs");
  EXPECT_THROWS(ringfeed::ObjectWriter w(pieces, config), RINGFEED_ERR_EXISTS, "pieces.bin");

  // Destroyed unfinished, or moved over: aborted, nothing left.
  {
    ringfeed::ObjectWriter w(dropped, config);
    w.write(b.data(), b.size());
  }
  EXPECT_THROWS(ringfeed::Object::read(dropped, config), RINGFEED_ERR_DATASET, "dropped.bin");
  {
    ringfeed::ObjectWriter w(dropped, config);
    w.write("first");
    ringfeed::ObjectWriter other(dropped, config);
    other.write("second");
    w = std::move(other);  // aborts "first"
    CHECK(w && !other, "a move leaves the source empty");
    w.finish();
  }
  auto second = ringfeed::Object::read(dropped, config);
  CHECK(std::string(second.begin(), second.end()) == "second", "the moved writer's object");
  {
    ringfeed::ObjectWriter w(base + "/aborted.bin", config);
    w.write("x");
    w.abort();
    CHECK(!w, "an aborted writer is not empty");
    w.abort();  // nothing on an empty writer
  }
  EXPECT_THROWS(ringfeed::Object::read(base + "/aborted.bin", config), RINGFEED_ERR_DATASET,
                "aborted.bin");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 6) {
    std::fprintf(stderr, "usage: %s SCRATCH_DIR [ENDPOINT ACCESS_KEY SECRET_KEY BUCKET]\n",
                 argv[0]);
    return 2;
  }
  const std::string scratch = argv[1];
  const std::string dir = scratch + "/cpp";
  CHECK(mkdir(dir.c_str(), 0755) == 0, "mkdir " + dir);
  const std::string local = "{\"part_size\": \"64KiB\", \"parts_in_flight\": 4}";
  round_trips(dir, local, "{\"overwrite\": true}", (1u << 20) + 3);
  // The defaults, as an empty string.
  CHECK(ringfeed::Object::read(dir + "/one.bin", "").size() == 777, "empty configuration");
  EXPECT_THROWS(ringfeed::Object::read(dir + "/one.bin", "{\"part_size\": 1}"),
                RINGFEED_ERR_CONFIG, "part_size");
  EXPECT_THROWS(ringfeed::Object::read(dir, local), RINGFEED_ERR_DATASET, "names");
  std::printf("local: ok\n");

  if (argc == 6) {
    const std::string keys = std::string("\"s3_endpoint\": \"") + argv[2] +
                             "\", \"aws_access_key_id\": \"" + argv[3] +
                             "\", \"aws_secret_access_key\": \"" + argv[4] +
                             "\", \"s3_region\": \"us-east-1\", \"part_size\": \"5MiB\"";
    round_trips(std::string("s3://") + argv[5] + "/cpp", "{" + keys + "}",
                "{" + keys + ", \"overwrite\": true}", (11u << 20) + 9);
    std::printf("s3: ok\n");
  }
  std::printf("object_wrapper_test: all checks passed\n");
  return 0;
}
