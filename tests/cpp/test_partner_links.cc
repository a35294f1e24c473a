// PartnerLinks (csrc/core/partner_links.h): ranks as threads of one process
// over a store in memory connect to their agreement partners through real
// loopback sockets, authenticated, and run BitAgreement rounds over them. A
// rank holding another secret is refused, and its partners name it.
#include "core/partner_links.h"

#include <poll.h>

#include <atomic>
#include <thread>

#include "check.h"
#include "core/address.h"
#include "core/bit_agreement.h"
#include "core/rank_handshake.h"
#include "memory_store.h"

using namespace hvd;

namespace {

struct Outcome {
  std::vector<uint64_t> result;
  std::string error;
};

// Rank r of n: connects, then runs `rounds` rounds with vector {r + 1 + k}
// (AND) and {1 << r} (OR), reading its partners with poll().
Outcome runRank(int n, int r, std::shared_ptr<hvd_test::MemoryStoreState> state,
                const std::string& secret, int rounds) {
  Outcome out;
  Topology t;
  t.rank = r;
  t.size = n;
  EngineConfig c;
  c.secret = secret;
  c.start_timeout = std::chrono::milliseconds(3000);
  hvd_test::MemoryStore store(state);
  try {
    AgreementLayout l{1, 1, 0};
    BitAgreement a(n, r, l);
    PartnerLinks links(t, c);
    links.connect(store, "job/", a.partners());
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    for (int k = 0; k < rounds; ++k) {
      a.start({static_cast<uint64_t>(r + 1 + k), uint64_t{1} << r});
      while (true) {
        std::vector<std::pair<int, AgreementMessage>> sends;
        a.takeSends(sends);
        for (auto& [to, m] : sends) links.send(to, m.encode());
        if (!a.active()) break;
        // Read first: a frame may wait in a socket's buffer (poll() would
        // not see it); sleep only when nothing came.
        bool got = false;
        for (int p : links.partners()) {
          std::vector<std::string> frames;
          const bool open = links.readFrom(p, frames);
          for (const auto& f : frames) {
            Status s = a.receive(p, AgreementMessage::decode(f, l.total()));
            if (!s.ok()) throw std::runtime_error(s.message);
          }
          got = got || !frames.empty();
          // A partner done with its rounds closes while this rank may still
          // wait for another: a close is this test's end, not an error.
          (void)open;
        }
        if (got) continue;
        if (std::chrono::steady_clock::now() > give_up) throw std::runtime_error("no result in 5 s");
        std::vector<pollfd> fds;
        std::vector<FrameSocket*> owners;
        links.watchList(fds, owners);
        if (::poll(fds.data(), fds.size(), 3000) <= 0) throw std::runtime_error("no message in 3 s");
      }
      out.result = a.result();
    }
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  return out;
}

std::vector<Outcome> runJob(int n, const std::vector<std::string>& secrets, int rounds) {
  auto state = std::make_shared<hvd_test::MemoryStoreState>();
  std::vector<Outcome> outs(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] { outs[r] = runRank(n, r, state, secrets[r], rounds); });
  for (auto& t : threads) t.join();
  return outs;
}

}  // namespace

TEST(ranks_agree_over_authenticated_links) {
  for (int n : {1, 2, 3, 5, 8}) {
    const int rounds = 3;
    std::vector<Outcome> outs = runJob(n, std::vector<std::string>(n, "s3cret"), rounds);
    uint64_t want_and = ~0ull, want_or = 0;
    for (int r = 0; r < n; ++r) {
      want_and &= static_cast<uint64_t>(r + rounds);
      want_or |= uint64_t{1} << r;
    }
    for (int r = 0; r < n; ++r) {
      CHECK_EQ(outs[r].error, std::string());
      CHECK(outs[r].result == (std::vector<uint64_t>{want_and, want_or}));
    }
  }
}

TEST(a_rank_without_the_secret_is_refused_and_named) {
  // Rank 3 of 4 holds another secret: rank 2 (its lower partner) refuses it.
  std::vector<std::string> secrets(4, "s3cret");
  secrets[3] = "guess";
  std::vector<Outcome> outs = runJob(4, secrets, 1);
  CHECK(outs[3].error.find("could not prove it knows the job's secret") != std::string::npos);
  CHECK(outs[2].error.find("agreement partners that never connected: [3]") != std::string::npos);
}

TEST(strangers_at_a_partner_listener_do_not_keep_the_ranks_apart) {
  // Before rank 1 connects, two strangers reach rank 0's agreement port: one
  // sends junk, one claims to be rank 1 and cannot prove the secret. Rank 0
  // drops both, and the ranks agree as before.
  auto state = std::make_shared<hvd_test::MemoryStoreState>();
  hvd_test::MemoryStore peek(state);
  std::vector<Outcome> outs(2);
  std::thread rank0([&] { outs[0] = runRank(2, 0, state, "s3cret", 2); });
  const Endpoint at = Endpoint::decode(peek.get("job/agree/0", std::chrono::milliseconds(3000)));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  FrameSocket junk(connectTcp(at.host, at.port, deadline));
  junk.send(std::string(64, '\xff'));
  junk.flushBlocking(std::chrono::milliseconds(1000));
  FrameSocket liar(connectTcp(at.host, at.port, deadline));
  std::string error;
  try {
    proveToPeer(liar, 1, "agreement", "guess", "rank 0", deadline, std::chrono::milliseconds(1000),
                [](const char* what) { return std::string(what); });
  } catch (const std::exception& e) {
    error = e.what();
  }
  CHECK(error.find("could not prove it knows the job's secret") != std::string::npos);
  std::thread rank1([&] { outs[1] = runRank(2, 1, state, "s3cret", 2); });
  rank0.join();
  rank1.join();
  for (int r = 0; r < 2; ++r) {
    CHECK_EQ(outs[r].error, std::string());
    CHECK(outs[r].result == (std::vector<uint64_t>{2, 3}));  // (1+1) & (2+1), 1 | 2
  }
}

int main() { return check::runAll(); }
