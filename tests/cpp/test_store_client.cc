// Standalone test of hvd::StoreClient against the Python store server.
//
//   test_store_client HOST PORT SECRET_HEX            run every case
//   test_store_client HOST PORT SECRET_HEX --closed   block in get() until the
//                                                     server is stopped
//
// The caller (tests/test_store.py) serves the store and sets "py/hello" to
// "from python" beforehand, so the two implementations are checked against each
// other, not only against themselves. Prints "N passed, M failed"; exit 0 iff
// nothing failed.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../../csrc/core/store_client.h"

using hvd::StoreClient;
using hvd::StoreError;
using hvd::StoreTimeout;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

namespace {

std::string gHost;
int gPort = 0;
std::string gSecret;

struct Failure {
  std::string what;
};

#define EXPECT(cond)                                                              \
  do {                                                                            \
    if (!(cond)) throw Failure{std::string(__FILE__ ":") + std::to_string(__LINE__) + \
                               ": expected " #cond};                              \
  } while (0)

std::unique_ptr<StoreClient> connect() {
  return std::make_unique<StoreClient>(gHost, gPort, gSecret, milliseconds(5000));
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

long msSince(Clock::time_point t0) {
  return static_cast<long>(
      std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count());
}

std::string fromHex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

void testSetGet() {
  auto c = connect();
  c->set("cpp/a", "alpha");
  EXPECT(c->get("cpp/a", milliseconds(1000)) == "alpha");
  std::string binary("x\0y\xff", 4);  // values are bytes, not C strings
  c->set("cpp/bin", std::vector<char>(binary.begin(), binary.end()));
  EXPECT(c->get("cpp/bin", milliseconds(1000)) == binary);
  c->set("cpp/a", "");
  EXPECT(c->get("cpp/a", milliseconds(1000)).empty());
}

void testLargeValue() {
  // Bigger than a socket buffer: exercises partial sends and reads.
  auto c = connect();
  std::string big(4 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131);
  c->set("cpp/big", big);
  EXPECT(c->get("cpp/big", milliseconds(5000)) == big);
}

void testValueFromPython() {
  auto c = connect();
  EXPECT(c->get("py/hello", milliseconds(1000)) == "from python");
}

void testGetTimeout() {
  auto c = connect();
  auto t0 = Clock::now();
  try {
    c->get("cpp/never", milliseconds(200));
    EXPECT(false);
  } catch (const StoreTimeout& e) {
    EXPECT(e.missingKeys() == std::vector<std::string>{"cpp/never"});
    EXPECT(contains(e.what(), "cpp/never"));
    EXPECT(contains(e.what(), c->address()));
  }
  long ms = msSince(t0);
  EXPECT(ms >= 150 && ms < 3000);
  // A timeout is an answer, not a broken connection.
  c->set("cpp/after-timeout", "1");
  EXPECT(c->check({"cpp/after-timeout"}));
}

void testWait() {
  auto c = connect();
  c->set("cpp/w1", "1");
  auto missing = c->wait({"cpp/w1", "cpp/w2", "cpp/w3"}, milliseconds(100));
  EXPECT((missing == std::vector<std::string>{"cpp/w2", "cpp/w3"}));
  c->set("cpp/w2", "2");
  c->set("cpp/w3", "3");
  EXPECT(c->wait({"cpp/w1", "cpp/w2", "cpp/w3"}, milliseconds(100)).empty());
  EXPECT(c->wait({}, milliseconds(0)).empty());
}

void testAddCheckListDelete() {
  auto c = connect();
  EXPECT(c->add("cpp/counter", 5) == 5);
  EXPECT(c->add("cpp/counter", -7) == -2);
  EXPECT(c->add("cpp/counter", 0) == -2);
  EXPECT(c->check({"cpp/counter"}));
  EXPECT(!c->check({"cpp/counter", "cpp/absent"}));
  c->set("cpp/list/1", "x");
  c->set("cpp/list/0", "y");
  EXPECT((c->listKeys("cpp/list/") == std::vector<std::string>{"cpp/list/0", "cpp/list/1"}));
  EXPECT(c->listKeys("cpp/nothing-here/").empty());
  c->deleteKey("cpp/list/0");
  EXPECT(!c->check({"cpp/list/0"}));
  c->deleteKey("cpp/list/0");  // deleting a missing key is fine
}

void testAddOnNonInteger() {
  auto c = connect();
  c->set("cpp/text", "not eight bytes");
  try {
    c->add("cpp/text", 1);
    EXPECT(false);
  } catch (const StoreError& e) {
    EXPECT(contains(e.what(), "cpp/text"));
  }
}

void testWrongSecret() {
  try {
    StoreClient bad(gHost, gPort, "wrong secret", milliseconds(5000));
    EXPECT(false);
  } catch (const StoreError& e) {
    EXPECT(contains(e.what(), "refused"));
    EXPECT(contains(e.what(), std::to_string(gPort)));
  }
  auto good = connect();  // the server keeps serving the job's clients
  good->set("cpp/after-bad-secret", "ok");
  EXPECT(good->get("cpp/after-bad-secret", milliseconds(1000)) == "ok");
}

void testWaiterWokenBySet() {
  auto waiter = connect();
  auto setter = connect();
  std::string got;
  std::thread t([&] { got = waiter->get("cpp/wake", StoreClient::kForever); });
  std::this_thread::sleep_for(milliseconds(100));
  auto t0 = Clock::now();
  setter->set("cpp/wake", "up");
  t.join();
  EXPECT(got == "up");
  EXPECT(msSince(t0) < 2000);
}

void testSharedClientThreads() {
  // One client, many threads: the mutex keeps requests and replies paired.
  auto c = connect();
  constexpr int kThreads = 8, kAdds = 200;
  std::vector<std::thread> threads;
  std::atomic<int> errors{0};
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      try {
        for (int j = 0; j < kAdds; ++j) {
          c->add("cpp/shared", 1);
          std::string key = "cpp/t" + std::to_string(i);
          c->set(key, std::to_string(j));
          if (c->get(key, milliseconds(1000)) != std::to_string(j)) ++errors;
        }
      } catch (...) {
        ++errors;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT(errors == 0);
  EXPECT(c->add("cpp/shared", 0) == kThreads * kAdds);
}

void testConnectTimeout() {
  // A port nobody listens on: the client retries, then names address and timeout.
  int port = 1;  // privileged and unused in the test environment
  auto t0 = Clock::now();
  try {
    StoreClient c("127.0.0.1", port, gSecret, milliseconds(300));
    EXPECT(false);
  } catch (const StoreError& e) {
    EXPECT(contains(e.what(), "127.0.0.1:1"));
    EXPECT(contains(e.what(), "300 ms"));
  }
  long ms = msSince(t0);
  EXPECT(ms >= 200 && ms < 3000);
}

int runAll() {
  const std::vector<std::pair<const char*, std::function<void()>>> tests = {
      {"set_get", testSetGet},
      {"large_value", testLargeValue},
      {"value_from_python", testValueFromPython},
      {"get_timeout", testGetTimeout},
      {"wait", testWait},
      {"add_check_list_delete", testAddCheckListDelete},
      {"add_on_non_integer", testAddOnNonInteger},
      {"wrong_secret", testWrongSecret},
      {"waiter_woken_by_set", testWaiterWokenBySet},
      {"shared_client_threads", testSharedClientThreads},
      {"connect_timeout", testConnectTimeout},
  };
  int passed = 0, failed = 0;
  for (const auto& [name, fn] : tests) {
    try {
      fn();
      ++passed;
      std::printf("ok   %s\n", name);
    } catch (const Failure& f) {
      ++failed;
      std::printf("FAIL %s: %s\n", name, f.what.c_str());
    } catch (const std::exception& e) {
      ++failed;
      std::printf("FAIL %s: unexpected exception: %s\n", name, e.what());
    }
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

// Blocks in get(kForever) until the server goes away; the call must then throw
// StoreError rather than hang.
int runClosed() {
  auto c = connect();
  c->set("cpp/closed/waiting", "1");
  try {
    c->get("cpp/closed/never", StoreClient::kForever);
    std::printf("FAIL closed_store: get returned\n");
    return 1;
  } catch (const StoreTimeout& e) {
    std::printf("FAIL closed_store: timeout instead of an error: %s\n", e.what());
    return 1;
  } catch (const StoreError& e) {
    std::printf("closed_store ok: %s\n", e.what());
    return 0;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s HOST PORT SECRET_HEX [--closed]\n", argv[0]);
    return 2;
  }
  gHost = argv[1];
  gPort = std::atoi(argv[2]);
  gSecret = fromHex(argv[3]);
  if (argc > 4 && std::string(argv[4]) == "--closed") return runClosed();
  return runAll();
}
