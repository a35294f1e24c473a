// A rendezvous store in memory, for tests that run ranks as threads of one
// process (test_engine, the backend tests): every rank holds its own
// MemoryStore, all of them over one MemoryStoreState. It overrides every
// request of StoreClient (core/store_client.h), so no socket is opened.
//
// Threading: any thread, as StoreClient; the state's mutex serializes them.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/store_client.h"

namespace hvd_test {

using hvd::StoreClient;
using hvd::StoreTimeout;
using std::chrono::milliseconds;

struct MemoryStoreState {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::string> kv;
};

// One rank's view of a store shared by every rank of the test.
class MemoryStore : public StoreClient {
 public:
  explicit MemoryStore(std::shared_ptr<MemoryStoreState> s)
      : StoreClient("memory"), s_(std::move(s)) {}

  void set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      s_->kv[key] = value;
    }
    s_->cv.notify_all();
  }
  std::string get(const std::string& key, milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(s_->mu);
    if (!s_->cv.wait_for(lock, timeout, [&] { return s_->kv.count(key) > 0; }))
      throw StoreTimeout("memory store: no key " + key, {key});
    return s_->kv[key];
  }
  std::vector<std::string> wait(const std::vector<std::string>& keys,
                                milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(s_->mu);
    auto missing = [&] {
      std::vector<std::string> m;
      for (const auto& k : keys)
        if (!s_->kv.count(k)) m.push_back(k);
      return m;
    };
    s_->cv.wait_for(lock, timeout, [&] { return missing().empty(); });
    return missing();
  }
  int64_t add(const std::string& key, int64_t delta) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    auto& v = s_->kv[key];
    const int64_t now = (v.empty() ? 0 : std::stoll(v)) + delta;
    v = std::to_string(now);
    s_->cv.notify_all();
    return now;
  }
  void deleteKey(const std::string& key) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->kv.erase(key);
  }
  bool check(const std::vector<std::string>& keys) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    for (const auto& k : keys)
      if (!s_->kv.count(k)) return false;
    return true;
  }
  std::vector<std::string> listKeys(const std::string& prefix) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    std::vector<std::string> out;
    for (auto it = s_->kv.lower_bound(prefix); it != s_->kv.end(); ++it) {
      if (it->first.compare(0, prefix.size(), prefix) != 0) break;
      out.push_back(it->first);
    }
    return out;
  }

 private:
  std::shared_ptr<MemoryStoreState> s_;
};

}  // namespace hvd_test
