// A tiny assertion helper for the engine's C++ unit tests, so they build with
// nothing but a compiler.
//
//   TEST(name) { CHECK(cond); CHECK_EQ(a, b); CHECK_THROWS(expr, Type); }
//   int main() { return check::runAll(); }
//
// A failed check prints file:line and the values and the test goes on, so one
// run shows every failure. A test passes when none of its checks failed and it
// threw nothing. runAll() prints one closing line, "N passed, M failed" (N and
// M count tests, not checks), and returns non-zero when M > 0;
// tests/unit/test_cpp_units.py reads that line.
//
// Checks may sit in loops over millions of cases: each test prints its first
// kMaxPrinted failures and counts the rest.
//
// Threading: single-threaded; call checks only from the test's own thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <exception>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace check {

constexpr int kMaxPrinted = 20;

struct Case {
  const char* name;
  void (*fn)();
};

inline std::vector<Case>& cases() {
  static std::vector<Case> all;
  return all;
}

struct Register {
  Register(const char* name, void (*fn)()) { cases().push_back({name, fn}); }
};

// Failures of the test that is running now.
inline int& currentFailures() {
  static int n = 0;
  return n;
}

inline void fail(const char* file, int line, const std::string& what) {
  if (++currentFailures() <= kMaxPrinted) std::printf("  %s:%d: %s\n", file, line, what.c_str());
}

// How a value is shown in a failure message.
template <typename T>
std::string show(const T& v);

inline std::string show(const std::string& s) { return "\"" + s + "\""; }
inline std::string show(const char* s) { return show(std::string(s)); }
inline std::string show(bool b) { return b ? "true" : "false"; }

template <typename T>
std::string show(const std::vector<T>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + show(v[i]);
  return out + "]";
}

template <typename T>
std::string show(const T& v) {
  std::ostringstream os;
  if constexpr (std::is_enum_v<T>) {
    os << static_cast<long long>(v);
  } else if constexpr (std::is_integral_v<T>) {
    // Integers as decimal and hex: half/bfloat16 bit patterns read best in hex.
    os << +v << " (0x" << std::hex << +static_cast<std::make_unsigned_t<T>>(v) << ")";
  } else if constexpr (std::is_floating_point_v<T>) {
    os.precision(17);
    os << v;
  } else {
    os << v;
  }
  return os.str();
}

// a == b without -Wsign-compare noise: integers of mixed signedness compare
// by value, so CHECK_EQ(v.size(), 3) means what it says.
template <typename A, typename B>
bool equal(const A& a, const B& b) {
  if constexpr (std::is_integral_v<A> && std::is_integral_v<B> &&
                std::is_signed_v<A> != std::is_signed_v<B>) {
    if constexpr (std::is_signed_v<A>) {
      return a >= 0 && static_cast<std::make_unsigned_t<A>>(a) == b;
    } else {
      return b >= 0 && a == static_cast<std::make_unsigned_t<B>>(b);
    }
  } else {
    return a == b;
  }
}

template <typename A, typename B>
bool checkEq(const A& a, const B& b, const char* ea, const char* eb, const char* file, int line) {
  if (equal(a, b)) return true;
  fail(file, line, std::string("CHECK_EQ(") + ea + ", " + eb + "): " + show(a) + " != " + show(b));
  return false;
}

inline int runAll() {
  int passed = 0;
  int failed = 0;
  for (const Case& c : cases()) {
    currentFailures() = 0;
    try {
      c.fn();
    } catch (const std::exception& e) {
      fail(__FILE__, __LINE__, std::string("uncaught exception: ") + e.what());
    } catch (...) {
      fail(__FILE__, __LINE__, "uncaught non-standard exception");
    }
    int n = currentFailures();
    if (n == 0) {
      ++passed;
    } else {
      ++failed;
      if (n > kMaxPrinted) std::printf("  ... and %d more failed checks\n", n - kMaxPrinted);
      std::printf("FAILED %s (%d failed checks)\n", c.name, n);
    }
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  std::fflush(stdout);
  return failed == 0 ? 0 : 1;
}

}  // namespace check

#define TEST(name)                                               \
  static void name();                                            \
  static const ::check::Register name##_registered(#name, name); \
  static void name()

// Both evaluate to true when the check held, so a test can stop early:
//   if (!CHECK_EQ(out.size(), 3)) return;
#define CHECK(cond) \
  ((cond) ? true : (::check::fail(__FILE__, __LINE__, "CHECK(" #cond ") failed"), false))

#define CHECK_EQ(a, b) ::check::checkEq((a), (b), #a, #b, __FILE__, __LINE__)

// Passes when `expr` throws `type` (or a subclass); a different exception or
// none is a failure.
#define CHECK_THROWS(expr, type)                                                               \
  do {                                                                                         \
    bool threw_expected_ = false;                                                              \
    try {                                                                                      \
      (void)(expr);                                                                            \
    } catch (const type&) {                                                                    \
      threw_expected_ = true;                                                                  \
    } catch (const std::exception& e_) {                                                       \
      ::check::fail(__FILE__, __LINE__,                                                        \
                    std::string("CHECK_THROWS(" #expr ", " #type "): threw ") + e_.what());    \
      threw_expected_ = true;                                                                  \
    }                                                                                          \
    if (!threw_expected_)                                                                      \
      ::check::fail(__FILE__, __LINE__, "CHECK_THROWS(" #expr ", " #type "): nothing thrown"); \
  } while (0)
