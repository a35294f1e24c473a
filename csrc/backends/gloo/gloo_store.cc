#include "gloo_store.h"

namespace hvd {

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  client_.set(prefix_ + key, data);
}

std::vector<char> GlooStore::get(const std::string& key) {
  std::string v = client_.get(prefix_ + key, timeout_);
  return std::vector<char>(v.begin(), v.end());
}

void GlooStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  std::vector<std::string> full;
  for (const auto& k : keys) full.push_back(prefix_ + k);
  auto missing = client_.wait(full, timeout);
  if (!missing.empty()) {
    throw StoreTimeout("Gloo rendezvous at store " + client_.address() + " timed out waiting for " +
                           missing[0] + (missing.size() > 1 ? " and others" : ""),
                       missing);
  }
}

}  // namespace hvd
