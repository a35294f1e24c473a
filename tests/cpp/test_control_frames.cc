// The control channel's frames (control_frames.h): every kind round-trips,
// and a cut or unknown frame is a WireError, never a wrong message.
#include <atomic>
#include <cstdlib>
#include <functional>
#include <limits>
#include <new>

#include "check.h"
#include "core/control_frames.h"
#include "core/wire.h"

using namespace hvd;

namespace {

Arrival arrivalWithRequest() {
  Arrival a;
  a.request.type = OpType::kAllgather;
  a.request.dtype = DataType::kFloat32;
  a.request.name = "grads.7";
  a.request.shape = {3, 4};
  a.request.process_set = 2;
  a.has_inline = true;
  a.inline_data = std::string("\x01\x00\x02zz", 5);
  return a;
}

Arrival cachedArrival(int32_t slot) {
  Arrival a;
  a.cache_id = slot;
  return a;
}

// Every proper prefix of `frame` must throw WireError when decoded by `decode`.
template <typename Decode>
int prefixesThatDecode(const std::string& frame, Decode decode) {
  int decoded = 0;
  for (size_t n = 0; n < frame.size(); ++n) {
    try {
      decode(frame.substr(0, n));
      ++decoded;
    } catch (const WireError&) {
    }
  }
  return decoded;
}

}  // namespace

TEST(arrivals_round_trip_with_the_senders_rank) {
  const std::string frame = encodeArrivals({arrivalWithRequest(), cachedArrival(5)});
  WorkerFrame f = decodeWorkerFrame(frame, 3);
  CHECK(f.kind == WorkerFrame::kRequests);
  CHECK_EQ(f.arrivals.size(), size_t{2});
  if (f.arrivals.size() != 2) return;
  CHECK_EQ(f.arrivals[0].rank, 3);
  CHECK_EQ(f.arrivals[0].cache_id, -1);
  CHECK(f.arrivals[0].request == arrivalWithRequest().request);
  CHECK(f.arrivals[0].has_inline);
  CHECK(f.arrivals[0].inline_data == arrivalWithRequest().inline_data);
  CHECK_EQ(f.arrivals[1].rank, 3);
  CHECK_EQ(f.arrivals[1].cache_id, 5);
  CHECK(!f.arrivals[1].has_inline);
}

TEST(bye_round_trips) {
  CHECK(decodeWorkerFrame(encodeBye(), 1).kind == WorkerFrame::kBye);
}

TEST(responses_round_trip_in_order) {
  Response a;
  a.kind = Response::kExecute;
  a.type = OpType::kAllgather;
  a.names = {"x", "y"};
  a.cache_ids = {1, -1};
  a.rank_first_dims = {{2, 3}, {4, 5}};
  Response b;
  b.kind = Response::kError;
  b.names = {"z"};
  b.error = "shapes differ";
  b.process_set = 4;
  CoordinatorFrame f = decodeCoordinatorFrame(encodeResponses({a, b}));
  CHECK(f.kind == CoordinatorFrame::kResponses);
  CHECK_EQ(f.responses.size(), size_t{2});
  if (f.responses.size() != 2) return;
  CHECK(f.responses[0].names == a.names);
  CHECK(f.responses[0].rank_first_dims == a.rank_first_dims);
  CHECK(f.responses[0].cache_ids == a.cache_ids);
  CHECK(f.responses[1].kind == Response::kError);
  CHECK_EQ(f.responses[1].error, std::string("shapes differ"));
  CHECK_EQ(f.responses[1].process_set, 4);
}

TEST(abort_welcome_and_tunables_round_trip) {
  CoordinatorFrame abort = decodeCoordinatorFrame(encodeAbort(Status::peerFailure("rank 2 exited")));
  CHECK(abort.kind == CoordinatorFrame::kAbort);
  CHECK_EQ(abort.abort.code, Status::kPeerFailure);
  CHECK_EQ(abort.abort.message, std::string("rank 2 exited"));
  // Rank 0's bug reaches the other ranks as a bug, not as a dead peer.
  CoordinatorFrame bug = decodeCoordinatorFrame(encodeAbort(Status::internal("internal: x")));
  CHECK_EQ(bug.abort.code, Status::kInternal);
  CHECK(isAbortFrame(encodeAbort(Status::internal("x"))));
  CHECK(!isAbortFrame(encodeResponses({})) && !isAbortFrame(encodeWelcome()) && !isAbortFrame(""));
  CHECK(decodeCoordinatorFrame(encodeWelcome()).kind == CoordinatorFrame::kWelcome);
  Tunables t;
  t.fusion_threshold = (size_t{1} << 33) + 7;  // over 32 bits
  t.inline_threshold = 12345;
  CoordinatorFrame tun = decodeCoordinatorFrame(encodeTunables(t));
  CHECK(tun.kind == CoordinatorFrame::kTunables);
  CHECK_EQ(tun.tunables.fusion_threshold, t.fusion_threshold);
  CHECK_EQ(tun.tunables.inline_threshold, t.inline_threshold);
}

Hello hello(uint32_t rank) {
  Hello h;
  h.rank = rank;
  h.nonce = std::string(32, 'n');
  return h;
}

Challenge challenge() {
  Challenge c;
  c.nonce = std::string(32, 's');
  c.proof = std::string(32, 'p');
  return c;
}

TEST(handshake_frames_round_trip) {
  Hello h = decodeHello(encodeHello(hello(7)));
  CHECK_EQ(h.version, kControlProtocolVersion);
  CHECK_EQ(h.rank, uint32_t{7});
  CHECK_EQ(h.nonce, std::string(32, 'n'));
  Challenge c = decodeChallenge(encodeChallenge(challenge()));
  CHECK_EQ(c.version, kControlProtocolVersion);
  CHECK_EQ(c.nonce, std::string(32, 's'));
  CHECK_EQ(c.proof, std::string(32, 'p'));
  CHECK_EQ(decodeProof(encodeProof("proof")), std::string("proof"));
}

// Another version's hello or challenge decodes to its version alone, so the
// side that reads it can name both; version 1's hello ({rank, secret}, no
// magic) is a WireError, never read as a rank.
TEST(other_versions_decode_to_their_version) {
  Hello future = hello(3);
  future.version = kControlProtocolVersion + 1;
  const Hello h = decodeHello(encodeHello(future) + "fields of version 3");
  CHECK_EQ(h.version, kControlProtocolVersion + 1);
  CHECK(h.nonce.empty());
  Challenge refusal;
  refusal.version = 9;
  CHECK_EQ(decodeChallenge(encodeChallenge(refusal)).version, uint32_t{9});
  Writer v1;
  v1.put<uint32_t>(1);
  v1.putString("the secret");
  CHECK_THROWS(decodeHello(v1.buffer()), WireError);
}

TEST(every_cut_frame_is_a_wire_error) {
  CHECK_EQ(prefixesThatDecode(encodeArrivals({arrivalWithRequest(), cachedArrival(5)}),
                              [](const std::string& f) { decodeWorkerFrame(f, 1); }),
           0);
  Response r;
  r.names = {"x"};
  r.cache_ids = {-1};
  CHECK_EQ(prefixesThatDecode(encodeResponses({r, r}),
                              [](const std::string& f) { decodeCoordinatorFrame(f); }),
           0);
  CHECK_EQ(prefixesThatDecode(encodeTunables(Tunables()),
                              [](const std::string& f) { decodeCoordinatorFrame(f); }),
           0);
  CHECK_EQ(prefixesThatDecode(encodeHello(hello(1)), [](const std::string& f) { decodeHello(f); }),
           0);
  CHECK_EQ(prefixesThatDecode(encodeChallenge(challenge()),
                              [](const std::string& f) { decodeChallenge(f); }),
           0);
  CHECK_EQ(prefixesThatDecode(encodeProof("p"), [](const std::string& f) { decodeProof(f); }), 0);
}

TEST(unknown_kinds_are_wire_errors) {
  CHECK_THROWS(decodeWorkerFrame(std::string(1, '\x09'), 1), WireError);
  CHECK_THROWS(decodeCoordinatorFrame(std::string(1, '\x09')), WireError);
}

// A frame's counts are the peer's: checked against what can follow before
// anything is reserved for them (tests/fuzz/regressions/control_frames/
// response_count_reserve asked for 15 GB; issue #44).
TEST(counts_beyond_the_frame_are_wire_errors_not_allocations) {
  std::string arrivals = encodeArrivals({cachedArrival(1)});
  arrivals.replace(1, 4, std::string("\xff\xff\xff\x0f", 4));
  CHECK_THROWS(decodeWorkerFrame(arrivals, 1), WireError);
  std::string responses = encodeResponses({});
  responses.replace(1, 4, std::string("\x00\x00\x00\x10", 4));
  CHECK_THROWS(decodeCoordinatorFrame(responses), WireError);
  // One arrival fewer than the count says is still cut, one more is trailing.
  std::string two = encodeArrivals({cachedArrival(1), cachedArrival(2)});
  two[1] = 3;
  CHECK_THROWS(decodeWorkerFrame(two, 1), WireError);
  two[1] = 1;
  CHECK_THROWS(decodeWorkerFrame(two, 1), WireError);
}

TEST(a_cached_arrival_with_a_negative_slot_is_a_wire_error) {
  std::string frame = encodeArrivals({cachedArrival(3)});
  frame.replace(6, 4, std::string("\xfe\xff\xff\xff", 4));  // slot -2
  CHECK_THROWS(decodeWorkerFrame(frame, 1), WireError);
}

TEST(trailing_bytes_are_wire_errors) {
  for (const std::string& f : {encodeBye(), encodeArrivals({cachedArrival(1)})})
    CHECK_THROWS(decodeWorkerFrame(f + "x", 1), WireError);
  for (const std::string& f : {encodeWelcome(), encodeResponses({}), encodeTunables(Tunables()),
                               encodeAbort(Status::peerFailure("x"))})
    CHECK_THROWS(decodeCoordinatorFrame(f + "x"), WireError);
  CHECK_THROWS(decodeHello(encodeHello(hello(1)) + "x"), WireError);
  CHECK_THROWS(decodeChallenge(encodeChallenge(challenge()) + "x"), WireError);
  CHECK_THROWS(decodeProof(encodeProof("p") + "x"), WireError);
}

// A host leader's relay frame and roster (issue #47) are rank 0's to decode
// from the network: hostile input, like every frame above. Their ranks index
// rank 0's tables, so a rank outside [1, size) is a WireError, never a read.

namespace {

// The largest single allocation since the last reset, on any thread: a
// decoder of a peer's frame must allocate no more than the frame could fill.
// A probe, not state the code under test reads; hence a global.
std::atomic<size_t> largest_allocation{0};

size_t largestAllocationDuring(const std::function<void()>& fn) {
  largest_allocation = 0;
  fn();
  return largest_allocation.load();
}

constexpr int kSize = 8;  // the job's ranks in these tests

std::vector<Relayed> relayedItems() {
  std::vector<Relayed> items(4);
  items[0].rank = 1;
  items[0].frame = encodeArrivals({arrivalWithRequest(), cachedArrival(5)});
  items[1].rank = 3;
  items[1].closed = true;
  items[2].rank = 2;  // an empty frame: relayed as it is
  items[3].rank = kSize - 1;
  items[3].frame = std::string("\x00\xff\x02\x00\x80zz\x00", 8);
  return items;
}

// A relay frame of one item, its rank and closed flag written as given.
std::string relayOf(int32_t rank, uint8_t closed, const std::string& frame = "") {
  Writer w;
  w.put<uint8_t>(WorkerFrame::kRelay);
  w.put<uint32_t>(1);
  w.put<int32_t>(rank);
  w.put<uint8_t>(closed);
  if (closed == 0) w.putString(frame);
  return w.buffer();
}

}  // namespace

// Operators new and delete counting the largest request (above): every
// allocation of this binary goes through them, in pairs with malloc and free
// (which GCC, seeing both ends inlined, takes for a mismatch).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpragmas"
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(size_t n) {
  size_t seen = largest_allocation.load(std::memory_order_relaxed);
  while (n > seen && !largest_allocation.compare_exchange_weak(seen, n, std::memory_order_relaxed)) {
  }
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  try {
    return ::operator new(n);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
#pragma GCC diagnostic pop

TEST(relay_frames_round_trip) {
  const std::vector<Relayed> items = relayedItems();
  const std::string frame = encodeRelay(items);
  CHECK(isRelayFrame(frame));
  const std::vector<Relayed> out = decodeRelay(frame, kSize);
  if (!CHECK_EQ(out.size(), items.size())) return;
  for (size_t i = 0; i < items.size(); ++i) {
    CHECK_EQ(out[i].rank, items[i].rank);
    CHECK_EQ(out[i].closed, items[i].closed);
    CHECK_EQ(out[i].frame, items[i].frame);
  }
  // The relayed frame is the rank's own, whole: it decodes as that rank's.
  const WorkerFrame inner = decodeWorkerFrame(out[0].frame, out[0].rank);
  CHECK_EQ(inner.arrivals.size(), size_t{2});
  CHECK(decodeRelay(encodeRelay({}), kSize).empty());
  CHECK(decodeRelay(encodeRelay({}), 1).empty());  // a job of one rank: nothing to relay
  // A closed rank's entry carries no frame, whatever the item held.
  Relayed closed;
  closed.rank = 2;
  closed.closed = true;
  const std::string bare = encodeRelay({closed});
  closed.frame = "ignored";
  CHECK_EQ(encodeRelay({closed}), bare);
  // Rank 0 reads a relay through this decoder only (control_relay.cc).
  CHECK_THROWS(decodeWorkerFrame(frame, 1), WireError);
}

TEST(rosters_round_trip) {
  const std::vector<int> ranks = {3, 1, kSize - 1, 2};
  CHECK(decodeRoster(encodeRoster(ranks), kSize) == ranks);
  CHECK(decodeRoster(encodeRoster({}), kSize).empty());
  CHECK(!isRelayFrame(encodeRoster(ranks)));
}

TEST(is_relay_frame_reads_only_the_kind) {
  CHECK(!isRelayFrame(""));
  CHECK(!isRelayFrame(encodeArrivals({})));
  CHECK(!isRelayFrame(encodeArrivals({cachedArrival(1)})));
  CHECK(!isRelayFrame(encodeBye()));
  CHECK(!isRelayFrame(encodeRoster({1})));
  CHECK(!isRelayFrame(std::string(1, '\x09')));
  CHECK(isRelayFrame(encodeRelay({})));
  CHECK(isRelayFrame(encodeRelay(relayedItems())));
}

TEST(every_cut_relay_frame_or_roster_is_a_wire_error) {
  CHECK_EQ(prefixesThatDecode(encodeRelay(relayedItems()),
                              [](const std::string& f) { decodeRelay(f, kSize); }),
           0);
  CHECK_EQ(prefixesThatDecode(encodeRelay({}), [](const std::string& f) { decodeRelay(f, kSize); }), 0);
  CHECK_EQ(prefixesThatDecode(encodeRoster({1, 2, 3}),
                              [](const std::string& f) { decodeRoster(f, kSize); }),
           0);
  CHECK_EQ(prefixesThatDecode(encodeRoster({}), [](const std::string& f) { decodeRoster(f, kSize); }), 0);
}

TEST(ranks_outside_one_to_size_are_wire_errors) {
  CHECK_EQ(decodeRelay(relayOf(kSize - 1, 0, "f"), kSize).at(0).rank, kSize - 1);
  CHECK_EQ(decodeRelay(relayOf(1, 1), kSize).at(0).rank, 1);
  for (int32_t rank : {0, -1, std::numeric_limits<int32_t>::min(), kSize, kSize + 1,
                       std::numeric_limits<int32_t>::max()}) {
    CHECK_THROWS(decodeRelay(relayOf(rank, 0, "f"), kSize), WireError);
    CHECK_THROWS(decodeRelay(relayOf(rank, 1), kSize), WireError);
    CHECK_THROWS(decodeRoster(encodeRoster({rank}), kSize), WireError);
    // A bad rank after good ones still fails the whole frame.
    CHECK_THROWS(decodeRoster(encodeRoster({1, 2, rank}), kSize), WireError);
  }
  // In a job of one rank, or of a size no job has, no rank is relayed.
  for (int size : {1, 0, -1}) {
    CHECK_THROWS(decodeRelay(relayOf(1, 1), size), WireError);
    CHECK_THROWS(decodeRoster(encodeRoster({1}), size), WireError);
  }
}

TEST(a_closed_flag_other_than_0_or_1_is_a_wire_error) {
  for (uint8_t flag : {2, 3, 0x80, 0xff}) {
    std::string frame = relayOf(2, 1);
    frame[9] = static_cast<char>(flag);  // u8 kind, u32 n, i32 rank, u8 closed
    CHECK_THROWS(decodeRelay(frame, kSize), WireError);
    // Nor is it read as "open" with the bytes after it taken for a frame.
    CHECK_THROWS(decodeRelay(frame + encodeProof("f"), kSize), WireError);
  }
}

TEST(relay_frames_and_rosters_with_trailing_bytes_are_wire_errors) {
  for (const std::string& tail : {std::string("x"), std::string(1, '\0'), std::string(4, '\0')}) {
    CHECK_THROWS(decodeRelay(encodeRelay(relayedItems()) + tail, kSize), WireError);
    CHECK_THROWS(decodeRelay(encodeRelay({}) + tail, kSize), WireError);
    CHECK_THROWS(decodeRoster(encodeRoster({1, 2}) + tail, kSize), WireError);
    CHECK_THROWS(decodeRoster(encodeRoster({}) + tail, kSize), WireError);
  }
}

TEST(wrong_kinds_are_wire_errors) {
  const std::string relay = encodeRelay(relayedItems());
  const std::string roster = encodeRoster({1, 2});
  CHECK_THROWS(decodeRelay(roster, kSize), WireError);
  CHECK_THROWS(decodeRoster(relay, kSize), WireError);
  for (const std::string& other : {encodeBye(), encodeArrivals({}), std::string(1, '\x09'), std::string()}) {
    CHECK_THROWS(decodeRelay(other, kSize), WireError);
    CHECK_THROWS(decodeRoster(other, kSize), WireError);
  }
  // The same body under another kind byte.
  for (uint8_t kind : {0, 1, 4, 0xff}) {
    std::string r = relay;
    r[0] = static_cast<char>(kind);
    CHECK_THROWS(decodeRelay(r, kSize), WireError);
    std::string s = roster;
    s[0] = static_cast<char>(kind);
    CHECK_THROWS(decodeRoster(s, kSize), WireError);
  }
}

// The count is the leader's: one beyond what follows is cut, one short leaves
// trailing bytes, and a count the frame's bytes could hold but whose items are
// bad allocates no more than the frame's size before it fails.
TEST(relay_and_roster_counts_beyond_the_frame_are_wire_errors_not_allocations) {
  // A frame whose u32 count (after the kind byte) is `n`.
  auto withCount = [](std::string frame, uint32_t n) {
    return frame.replace(1, 4, reinterpret_cast<const char*>(&n), 4);
  };
  const std::string relay = encodeRelay(relayedItems());  // 4 items
  const std::string roster = encodeRoster({1, 2, 3});     // 3 ranks
  for (uint32_t n : {0xffffffffu, 0x80000000u, 0x10000000u, 5u, 3u}) {
    const std::string r = withCount(relay, n);
    const size_t largest = largestAllocationDuring([&] { CHECK_THROWS(decodeRelay(r, kSize), WireError); });
    CHECK(largest < (size_t{1} << 20));
  }
  for (uint32_t n : {0xffffffffu, 0x80000000u, 0x10000000u, 4u, 2u}) {
    const std::string s = withCount(roster, n);
    const size_t largest = largestAllocationDuring([&] { CHECK_THROWS(decodeRoster(s, kSize), WireError); });
    CHECK(largest < (size_t{1} << 20));
  }
  // 4 MiB of zeros: as many items as their smallest size fits (rank 0, the
  // first one, is refused).
  const std::string zeros(size_t{4} << 20, '\0');
  for (size_t item : {size_t{5}, size_t{4}}) {
    const uint32_t n = static_cast<uint32_t>(zeros.size() / item);
    Writer w;
    w.put<uint8_t>(item == 5 ? WorkerFrame::kRelay : WorkerFrame::kRoster);
    w.put<uint32_t>(n);
    w.append(zeros.data(), zeros.size());
    const std::string frame = w.buffer();
    const size_t largest = largestAllocationDuring([&] {
      if (item == 5) {
        CHECK_THROWS(decodeRelay(frame, kSize), WireError);
      } else {
        CHECK_THROWS(decodeRoster(frame, kSize), WireError);
      }
    });
    CHECK(largest <= frame.size());
  }
}

int main() { return check::runAll(); }
