// Fuzz target: the control channel's frames (csrc/core/control_frames.h):
// what the coordinator reads from every rank (decodeWorkerFrame, and the
// handshake's decodeHello and decodeProof, read from anyone who connects) and
// what the ranks read from the coordinator (decodeCoordinatorFrame, and the
// handshake's decodeChallenge, read from whatever answers at rank 0's address).
//
// Input: one byte picks the decoder, the rest is the frame. A decode either
// throws WireError or gives frames whose encoding decodes to the same bytes
// again; isAbortFrame() agrees with the decoder.
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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const uint8_t which = in.byte() % 5;
  const int rank = in.byte();
  const std::string frame = in.rest();
  try {
    switch (which) {
      case 0: workerFrame(frame, rank); break;
      case 1: coordinatorFrame(frame); break;
      case 2: hello(frame); break;
      case 3: challenge(frame); break;
      default: proof(frame); break;
    }
  } catch (const WireError&) {
    // A malformed frame: the engine drops the stranger or fails the peer.
  }
  return 0;
}
