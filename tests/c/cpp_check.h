// cpp_check.h — what the C++ test programs check with: CHECK, and
// EXPECT_THROWS for a statement that must throw ringfeed::Error with a given
// status, what() beginning with the status name, and a message that
// mentions a needle.

#ifndef RINGFEED_TEST_CPP_CHECK_H
#define RINGFEED_TEST_CPP_CHECK_H

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "ringfeed.hpp"

namespace {

[[noreturn]] [[maybe_unused]] void fail(const char* file, int line, const char* cond, const std::string& why) {
  std::fprintf(stderr, "%s:%d: CHECK(%s) failed: %s\n", file, line, cond, why.c_str());
  std::exit(1);
}

#define CHECK(cond, why)                                \
  do {                                                   \
    if (!(cond)) fail(__FILE__, __LINE__, #cond, (why)); \
  } while (0)

// Runs `body`, which must throw ringfeed::Error with status `want`, what()
// beginning with the status name, and a message that mentions `needle`.
template <typename Body>
void expect_throws(int line, const char* what, Body body, std::int32_t want,
                   const std::string& needle) {
  try {
    body();
  } catch (const ringfeed::Error& e) {
    std::string text = e.what();
    if (e.status() != want) fail(__FILE__, line, what, "threw " + text);
    if (text.rfind(std::string(ringfeed::status_name(want)) + ": ", 0) != 0) {
      fail(__FILE__, line, what, "what() does not start with the status name: " + text);
    }
    if (e.message().empty() || e.message().find(needle) == std::string_view::npos) {
      fail(__FILE__, line, what, "the message does not mention \"" + needle + "\": " + text);
    }
    std::printf("  %s\n", e.what());
    return;
  }
  fail(__FILE__, line, what, "did not throw");
}

#define EXPECT_THROWS(stmt, want, needle) \
  expect_throws(__LINE__, #stmt, [&] { stmt; }, (want), (needle))

}  // namespace

#endif
