// The control channel's frames (control_frames.h): every kind round-trips,
// and a cut or unknown frame is a WireError, never a wrong message.
#include "check.h"
#include "core/control_frames.h"

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

int main() { return check::runAll(); }
