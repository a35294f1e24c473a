// Fuzz target: the control channel's frames (csrc/core/control_frames.h):
// what the coordinator reads from every rank (decodeWorkerFrame, and the
// handshake's decodeHello and decodeProof, read from anyone who connects) and
// what the ranks read from the coordinator (decodeCoordinatorFrame, and the
// handshake's decodeChallenge, read from whatever answers at rank 0's address),
// and what rank 0 reads from a host leader (decodeRelay, decodeRoster).
//
// Input: one byte picks the decoder (0 worker frame, 1 coordinator frame,
// 2 hello, 3 challenge, 4 proof, 5 relay, 6 roster; a seed's byte keeps its
// meaning), one byte is the sender's rank (the job's size for 5 and 6), the
// rest is the frame. A decode either throws WireError or gives frames whose
// encoding decodes to the same bytes again; isAbortFrame() and isRelayFrame()
// agree with the decoders, and a relay's ranks are in [1, size).
#include "core/control_frames.h"
#include "fuzz_check.h"

using namespace hvd;

namespace {

std::string encoded(const Request& q) {
  Writer w;
  q.encode(w);
  return w.buffer();
}

std::string reencodeWorker(const WorkerFrame& f) {
  return f.kind == WorkerFrame::kBye ? encodeBye() : encodeArrivals(f.arrivals);
}

std::string reencodeCoordinator(const CoordinatorFrame& f) {
  switch (f.kind) {
    case CoordinatorFrame::kResponses: return encodeResponses(f.responses);
    case CoordinatorFrame::kAbort: return encodeAbort(f.abort);
    case CoordinatorFrame::kWelcome: return encodeWelcome();
    case CoordinatorFrame::kTunables: return encodeTunables(f.tunables);
  }
  FUZZ_CHECK(false && "a decoded frame of no kind");
  return {};
}

void workerFrame(const std::string& frame, int rank) {
  const WorkerFrame f = decodeWorkerFrame(frame, rank);
  // Rank 0 tells a relay from a rank's own frame by this (control_relay.cc).
  FUZZ_CHECK(!isRelayFrame(frame));
  for (const auto& a : f.arrivals) {
    FUZZ_CHECK(a.rank == rank);
    FUZZ_CHECK(a.has_inline || a.inline_data.empty());
  }
  const std::string bytes = reencodeWorker(f);
  // Every byte of the frame was read, and means something: its encoding is
  // as long (flags may come back as 1 where the frame had another non-zero).
  FUZZ_CHECK(bytes.size() == frame.size());
  const WorkerFrame again = decodeWorkerFrame(bytes, rank);
  FUZZ_CHECK(again.kind == f.kind);
  FUZZ_CHECK(again.arrivals.size() == f.arrivals.size());
  for (size_t i = 0; i < f.arrivals.size(); ++i) {
    const Arrival& a = f.arrivals[i];
    const Arrival& b = again.arrivals[i];
    // A cached arrival carries its slot, never a request (coordinator.h).
    FUZZ_CHECK(a.cache_id == b.cache_id);
    // Compared by encoding: a NaN scale factor is never == itself.
    FUZZ_CHECK(a.cache_id >= 0 || encoded(a.request) == encoded(b.request));
    FUZZ_CHECK(a.has_inline == b.has_inline && a.inline_data == b.inline_data);
  }
  FUZZ_CHECK(reencodeWorker(again) == bytes);
}

void coordinatorFrame(const std::string& frame) {
  const CoordinatorFrame f = decodeCoordinatorFrame(frame);
  FUZZ_CHECK(isAbortFrame(frame) == (f.kind == CoordinatorFrame::kAbort));
  if (f.kind == CoordinatorFrame::kAbort) FUZZ_CHECK(!f.abort.ok());
  const std::string bytes = reencodeCoordinator(f);
  FUZZ_CHECK(bytes.size() == frame.size());
  const CoordinatorFrame again = decodeCoordinatorFrame(bytes);
  FUZZ_CHECK(again.kind == f.kind && again.responses.size() == f.responses.size());
  FUZZ_CHECK(again.abort.code == f.abort.code && again.abort.message == f.abort.message);
  FUZZ_CHECK(again.tunables.fusion_threshold == f.tunables.fusion_threshold);
  FUZZ_CHECK(again.tunables.inline_threshold == f.tunables.inline_threshold);
  FUZZ_CHECK(reencodeCoordinator(again) == bytes);
}

void hello(const std::string& frame) {
  const Hello h = decodeHello(frame);
  const Hello again = decodeHello(encodeHello(h));
  FUZZ_CHECK(again.version == h.version && again.rank == h.rank && again.nonce == h.nonce);
  // No flag in a hello: exactly its bytes, but for another version's fields,
  // which are never read.
  if (h.version == kControlProtocolVersion) FUZZ_CHECK(encodeHello(h) == frame);
}

void challenge(const std::string& frame) {
  const Challenge c = decodeChallenge(frame);
  const Challenge again = decodeChallenge(encodeChallenge(c));
  FUZZ_CHECK(again.version == c.version && again.nonce == c.nonce && again.proof == c.proof);
  if (c.version == kControlProtocolVersion) FUZZ_CHECK(encodeChallenge(c) == frame);
}

void proof(const std::string& frame) {
  FUZZ_CHECK(encodeProof(decodeProof(frame)) == frame);
}

// Rank 0 indexes its tables by a relayed rank: [1, size) is the contract.
void relay(const std::string& frame, int size) {
  const std::vector<Relayed> items = decodeRelay(frame, size);
  FUZZ_CHECK(isRelayFrame(frame));
  for (const auto& item : items) {
    FUZZ_CHECK(item.rank >= 1 && item.rank < size);
    FUZZ_CHECK(!item.closed || item.frame.empty());
  }
  // No flag but 0 or 1 decodes, so the frame is its items' one encoding.
  FUZZ_CHECK(encodeRelay(items) == frame);
  const std::vector<Relayed> again = decodeRelay(frame, size);
  FUZZ_CHECK(again.size() == items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    FUZZ_CHECK(again[i].rank == items[i].rank && again[i].closed == items[i].closed);
    FUZZ_CHECK(again[i].frame == items[i].frame);
  }
  // What rank 0 does next: each relayed frame is its rank's worker frame.
  for (const auto& item : items) {
    if (item.closed) continue;
    try {
      workerFrame(item.frame, item.rank);
    } catch (const WireError&) {
    }
  }
}

void roster(const std::string& frame, int size) {
  const std::vector<int> ranks = decodeRoster(frame, size);
  for (int r : ranks) FUZZ_CHECK(r >= 1 && r < size);
  FUZZ_CHECK(encodeRoster(ranks) == frame);
  FUZZ_CHECK(decodeRoster(frame, size) == ranks);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  // Seeds are written with the values 0..6, which keep their decoders.
  const uint8_t which = in.byte() % 7;
  const int rank = in.byte();  // the sender's, or the job's size (relay, roster)
  const std::string frame = in.rest();
  try {
    switch (which) {
      case 0: workerFrame(frame, rank); break;
      case 1: coordinatorFrame(frame); break;
      case 2: hello(frame); break;
      case 3: challenge(frame); break;
      case 4: proof(frame); break;
      case 5: relay(frame, rank); break;
      default: roster(frame, rank); break;
    }
  } catch (const WireError&) {
    // A malformed frame: the engine drops the stranger or fails the peer.
  }
  return 0;
}
