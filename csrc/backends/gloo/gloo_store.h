// Gloo's rendezvous store interface over the job's key-value store, so Gloo's
// full-mesh connect exchanges its addresses through the launcher's store.
// Threading: used by the thread that builds the Gloo context (init()).
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <string>

#include "../../core/store_client.h"

namespace hvd {

class GlooStore : public gloo::rendezvous::Store {
 public:
  GlooStore(StoreClient& client, std::string prefix, std::chrono::milliseconds timeout)
      : client_(client), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  StoreClient& client_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

}  // namespace hvd
