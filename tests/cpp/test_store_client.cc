// Standalone test of hvd::StoreClient against the Python store server.
//
//   test_store_client HOST PORT SECRET_HEX            run every case
//   test_store_client HOST PORT SECRET_HEX --closed   block in get() until the
//                                                     server is stopped
//   test_store_client HOST PORT SECRET_HEX --oversized  send a frame over the
//                                                     server's limit
//   test_store_client HOST PORT SECRET_HEX --refused  connect to something that
//                                                     is not the job's store: the
//                                                     handshake must fail
//
// The caller (tests/launcher/test_store.py) serves the store and sets "py/hello" to
// "from python" beforehand, so the two implementations are checked against each
// other, not only against themselves. Uses tests/cpp/check.h: prints
// "N passed, M failed" and exits 0 iff nothing failed.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../../csrc/core/store_client.h"
#include "check.h"

using hvd::StoreClient;
using hvd::StoreError;
using hvd::StoreTimeout;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

namespace {

// Set by main() from argv before any test runs.
std::string gHost;
int gPort = 0;
std::string gSecret;

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

}  // namespace

TEST(setGet) {
  auto c = connect();
  c->set("cpp/a", "alpha");
  CHECK_EQ(c->get("cpp/a", milliseconds(1000)), std::string("alpha"));
  std::string binary("x\0y\xff", 4);  // values are bytes, not C strings
  c->set("cpp/bin", std::vector<char>(binary.begin(), binary.end()));
  CHECK(c->get("cpp/bin", milliseconds(1000)) == binary);
  c->set("cpp/a", "");
  CHECK(c->get("cpp/a", milliseconds(1000)).empty());
}

TEST(largeValue) {
  // Bigger than a socket buffer: exercises partial sends and reads.
  auto c = connect();
  std::string big(4 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131);
  c->set("cpp/big", big);
  CHECK(c->get("cpp/big", milliseconds(5000)) == big);
}

TEST(valueFromPython) {
  auto c = connect();
  CHECK_EQ(c->get("py/hello", milliseconds(1000)), std::string("from python"));
}

TEST(getTimeout) {
  auto c = connect();
  auto t0 = Clock::now();
  try {
    c->get("cpp/never", milliseconds(200));
    CHECK(!"get returned a value");
  } catch (const StoreTimeout& e) {
    CHECK_EQ(e.missingKeys(), std::vector<std::string>{"cpp/never"});
    CHECK(contains(e.what(), "cpp/never"));
    CHECK(contains(e.what(), c->address()));
  }
  long ms = msSince(t0);
  CHECK(ms >= 150 && ms < 3000);
  // A timeout is an answer, not a broken connection.
  c->set("cpp/after-timeout", "1");
  CHECK(c->check({"cpp/after-timeout"}));
}

TEST(wait) {
  auto c = connect();
  c->set("cpp/w1", "1");
  CHECK_EQ(c->wait({"cpp/w1", "cpp/w2", "cpp/w3"}, milliseconds(100)),
           (std::vector<std::string>{"cpp/w2", "cpp/w3"}));
  c->set("cpp/w2", "2");
  c->set("cpp/w3", "3");
  CHECK(c->wait({"cpp/w1", "cpp/w2", "cpp/w3"}, milliseconds(100)).empty());
  CHECK(c->wait({}, milliseconds(0)).empty());
}

TEST(addCheckListDelete) {
  auto c = connect();
  CHECK_EQ(c->add("cpp/counter", 5), 5);
  CHECK_EQ(c->add("cpp/counter", -7), -2);
  CHECK_EQ(c->add("cpp/counter", 0), -2);
  CHECK(c->check({"cpp/counter"}));
  CHECK(!c->check({"cpp/counter", "cpp/absent"}));
  c->set("cpp/list/1", "x");
  c->set("cpp/list/0", "y");
  CHECK_EQ(c->listKeys("cpp/list/"), (std::vector<std::string>{"cpp/list/0", "cpp/list/1"}));
  CHECK(c->listKeys("cpp/nothing-here/").empty());
  c->deleteKey("cpp/list/0");
  CHECK(!c->check({"cpp/list/0"}));
  c->deleteKey("cpp/list/0");  // deleting a missing key is fine
}

TEST(addOnNonInteger) {
  auto c = connect();
  c->set("cpp/text", "not eight bytes");
  try {
    c->add("cpp/text", 1);
    CHECK(!"ADD on a non-integer succeeded");
  } catch (const StoreError& e) {
    CHECK(contains(e.what(), "cpp/text"));
  }
  CHECK_EQ(c->get("cpp/text", milliseconds(1000)), std::string("not eight bytes"));
}

TEST(wrongSecret) {
  try {
    StoreClient bad(gHost, gPort, "wrong secret", milliseconds(5000));
    CHECK(!"a wrong secret was accepted");
  } catch (const StoreError& e) {
    // The client checks the server's proof first; with another secret it fails.
    CHECK(contains(e.what(), "could not prove it knows the job's secret"));
    CHECK(contains(e.what(), std::to_string(gPort)));
  }
  auto good = connect();  // the server keeps serving the job's clients
  good->set("cpp/after-bad-secret", "ok");
  CHECK_EQ(good->get("cpp/after-bad-secret", milliseconds(1000)), std::string("ok"));
}

TEST(waiterWokenBySet) {
  auto waiter = connect();
  auto setter = connect();
  std::string got;
  std::thread t([&] { got = waiter->get("cpp/wake", StoreClient::kForever); });
  std::this_thread::sleep_for(milliseconds(100));
  auto t0 = Clock::now();
  setter->set("cpp/wake", "up");
  t.join();
  CHECK_EQ(got, std::string("up"));
  CHECK(msSince(t0) < 2000);
}

TEST(sharedClientThreads) {
  // One client, many threads: the mutex keeps requests and replies paired.
  // Checks stay on this thread (check.h is single-threaded); workers count errors.
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
  CHECK_EQ(errors.load(), 0);
  CHECK_EQ(c->add("cpp/shared", 0), kThreads * kAdds);
}

TEST(connectTimeout) {
  // Port 1: privileged, nobody listens. The client retries until the timeout,
  // then names the address and the timeout.
  auto t0 = Clock::now();
  try {
    StoreClient c("127.0.0.1", 1, gSecret, milliseconds(300));
    CHECK(!"connected to port 1");
  } catch (const StoreError& e) {
    CHECK(contains(e.what(), "127.0.0.1:1"));
    CHECK(contains(e.what(), "300 ms"));
  }
  long ms = msSince(t0);
  CHECK(ms >= 200 && ms < 3000);
}

namespace {

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

// Against a server whose frame limit is under 1 MiB: a set() of 1 MiB is
// refused, and the error says why (the limit and its variable), not that the
// connection was lost.
int runOversized() {
  auto c = connect();
  try {
    c->set("cpp/oversized", std::string(1 << 20, 'x'));
    std::printf("FAIL oversized: set returned\n");
    return 1;
  } catch (const StoreError& e) {
    const bool says_why = contains(e.what(), "HVD_TORCH_STORE_MAX_FRAME");
    std::printf("%s oversized: %s\n", says_why ? "ok" : "FAIL", e.what());
    return says_why ? 0 : 1;
  }
}

// Against a listener that is not the job's store (tests/launcher/
// test_store_auth.py): the constructor must throw; prints its message.
int runRefused() {
  try {
    StoreClient c(gHost, gPort, gSecret, milliseconds(5000));
    std::printf("FAIL refused: the handshake succeeded\n");
    return 1;
  } catch (const StoreError& e) {
    std::printf("refused: %s\n", e.what());
    return 0;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s HOST PORT SECRET_HEX [--closed|--oversized|--refused]\n", argv[0]);
    return 2;
  }
  gHost = argv[1];
  gPort = std::atoi(argv[2]);
  gSecret = fromHex(argv[3]);
  if (argc > 4 && std::string(argv[4]) == "--closed") return runClosed();
  if (argc > 4 && std::string(argv[4]) == "--oversized") return runOversized();
  if (argc > 4 && std::string(argv[4]) == "--refused") return runRefused();
  return check::runAll();
}
