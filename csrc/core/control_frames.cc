#include "control_frames.h"

#include <algorithm>

#include "wire.h"

namespace hvd {

std::string encodeArrivals(const std::vector<Arrival>& arrivals) {
  // u8 kind, u32 n, n x (u8 cached, i32 slot | Request, u8 inline, bytes)
  Writer w;
  w.put<uint8_t>(WorkerFrame::kRequests);
  w.put<uint32_t>(static_cast<uint32_t>(arrivals.size()));
  for (const auto& a : arrivals) {
    w.put<uint8_t>(a.cache_id >= 0);
    if (a.cache_id >= 0) {
      w.put<int32_t>(a.cache_id);
    } else {
      a.request.encode(w);
    }
    w.put<uint8_t>(a.has_inline);
    if (a.has_inline) w.putBytes(a.inline_data.data(), a.inline_data.size());
  }
  return std::move(w.buffer());
}

std::string encodeBye() {
  Writer w;
  w.put<uint8_t>(WorkerFrame::kBye);
  return std::move(w.buffer());
}

WorkerFrame decodeWorkerFrame(const std::string& frame, int rank) {
  Reader r(frame);
  WorkerFrame out;
  const uint8_t kind = r.get<uint8_t>();
  if (kind == WorkerFrame::kBye) {
    if (!r.done()) throw WireError("trailing bytes in a control frame from a rank");
    out.kind = WorkerFrame::kBye;
    return out;
  }
  if (kind != WorkerFrame::kRequests) throw WireError("unknown control frame from a rank");
  // The count is the peer's: checked against what can follow (an arrival
  // takes at least a flag, a slot and a flag), and reserved for only up to a
  // bound, since an Arrival is 48 times the 6 bytes of a cached one: past it
  // the vector grows with arrivals that decoded, not with what a count claims.
  const uint32_t n = r.getCount(1 + 4 + 1);
  out.arrivals.reserve(std::min<uint32_t>(n, 4096));
  for (uint32_t i = 0; i < n; ++i) {
    Arrival a;
    a.rank = rank;
    if (r.get<uint8_t>()) {
      // A cached arrival names its slot; a negative one would be taken for
      // an arrival with a request (coordinator.h), here an empty one.
      a.cache_id = r.get<int32_t>();
      if (a.cache_id < 0) throw WireError("negative cache slot from a rank");
    } else {
      a.request = Request::decode(r);
    }
    a.has_inline = r.get<uint8_t>() != 0;
    if (a.has_inline) {
      uint32_t len;
      const char* p = r.getBytes(&len);
      a.inline_data.assign(p, len);
    }
    out.arrivals.push_back(std::move(a));
  }
  if (!r.done()) throw WireError("trailing bytes in a control frame from a rank");
  return out;
}

std::string encodeRelay(const std::vector<Relayed>& items) {
  // u8 kind, u32 n, n x (i32 rank, u8 closed, [bytes frame])
  Writer w;
  w.put<uint8_t>(WorkerFrame::kRelay);
  w.put<uint32_t>(static_cast<uint32_t>(items.size()));
  for (const auto& item : items) {
    w.put<int32_t>(item.rank);
    w.put<uint8_t>(item.closed);
    if (!item.closed) w.putString(item.frame);
  }
  return std::move(w.buffer());
}

bool isRelayFrame(const std::string& frame) {
  return !frame.empty() && static_cast<uint8_t>(frame[0]) == WorkerFrame::kRelay;
}

namespace {

int checkedRank(Reader& r, int size, const char* what) {
  const int32_t rank = r.get<int32_t>();
  if (rank < 1 || rank >= size)
    throw WireError(std::string(what) + " names rank " + std::to_string(rank) + ", not in [1, " +
                    std::to_string(size) + ")");
  return rank;
}

}  // namespace

std::vector<Relayed> decodeRelay(const std::string& frame, int size) {
  Reader r(frame);
  if (r.get<uint8_t>() != WorkerFrame::kRelay) throw WireError("not a host leader's relay frame");
  const uint32_t n = r.getCount(4 + 1);
  std::vector<Relayed> out;
  out.reserve(std::min<uint32_t>(n, 4096));
  for (uint32_t i = 0; i < n; ++i) {
    Relayed item;
    item.rank = checkedRank(r, size, "a relay frame");
    const uint8_t closed = r.get<uint8_t>();
    if (closed > 1) throw WireError("relay frame with closed flag " + std::to_string(closed));
    item.closed = closed == 1;
    if (!item.closed) item.frame = r.getString();
    out.push_back(std::move(item));
  }
  if (!r.done()) throw WireError("trailing bytes in a relay frame");
  return out;
}

std::string encodeRoster(const std::vector<int>& ranks) {
  Writer w;  // u8 kind, u32 n, n x i32 rank
  w.put<uint8_t>(WorkerFrame::kRoster);
  w.put<uint32_t>(static_cast<uint32_t>(ranks.size()));
  for (int rank : ranks) w.put<int32_t>(rank);
  return std::move(w.buffer());
}

std::vector<int> decodeRoster(const std::string& frame, int size) {
  Reader r(frame);
  if (r.get<uint8_t>() != WorkerFrame::kRoster) throw WireError("not a host leader's roster");
  const uint32_t n = r.getCount(4);
  std::vector<int> ranks;
  ranks.reserve(n);  // bounded by the frame's bytes (getCount)
  for (uint32_t i = 0; i < n; ++i) ranks.push_back(checkedRank(r, size, "a roster"));
  if (!r.done()) throw WireError("trailing bytes in a roster");
  return ranks;
}

std::string encodeResponses(const std::vector<Response>& responses) {
  Writer w;  // u8 kind, u32 n, n x Response
  w.put<uint8_t>(CoordinatorFrame::kResponses);
  w.put<uint32_t>(static_cast<uint32_t>(responses.size()));
  for (const auto& r : responses) r.encode(w);
  return std::move(w.buffer());
}

std::string encodeAbort(const Status& status) {
  Writer w;  // u8 kind, u8 status code, message
  w.put<uint8_t>(CoordinatorFrame::kAbort);
  w.put<uint8_t>(status.code);
  w.putString(status.message);
  return std::move(w.buffer());
}

bool isAbortFrame(const std::string& frame) {
  return !frame.empty() && static_cast<uint8_t>(frame[0]) == CoordinatorFrame::kAbort;
}

std::string encodeWelcome() {
  Writer w;
  w.put<uint8_t>(CoordinatorFrame::kWelcome);
  return std::move(w.buffer());
}

std::string encodeTunables(const Tunables& t) {
  Writer w;
  w.put<uint8_t>(CoordinatorFrame::kTunables);
  w.put<uint64_t>(t.fusion_threshold);
  w.put<uint64_t>(t.inline_threshold);
  return std::move(w.buffer());
}

CoordinatorFrame decodeCoordinatorFrame(const std::string& frame) {
  Reader r(frame);
  CoordinatorFrame out;
  switch (r.get<uint8_t>()) {
    case CoordinatorFrame::kResponses: {
      out.kind = CoordinatorFrame::kResponses;
      // The count is checked against what can follow before the reservation.
      const uint32_t n = r.getCount(Response::kMinEncodedBytes);
      out.responses.reserve(n);
      for (uint32_t i = 0; i < n; ++i) out.responses.push_back(Response::decode(r));
      break;
    }
    case CoordinatorFrame::kAbort: {
      out.kind = CoordinatorFrame::kAbort;
      const uint8_t code = r.get<uint8_t>();
      if (!isStatusCode(code) || code == Status::kOk)
        throw WireError("abort frame with status code " + std::to_string(code));
      out.abort.code = static_cast<Status::Code>(code);
      out.abort.message = r.getString();
      break;
    }
    case CoordinatorFrame::kWelcome:
      out.kind = CoordinatorFrame::kWelcome;
      break;
    case CoordinatorFrame::kTunables:
      out.kind = CoordinatorFrame::kTunables;
      out.tunables.fusion_threshold = static_cast<size_t>(r.get<uint64_t>());
      out.tunables.inline_threshold = static_cast<size_t>(r.get<uint64_t>());
      break;
    default:
      throw WireError("unknown control frame from the coordinator");
  }
  if (!r.done()) throw WireError("trailing bytes in a control frame from the coordinator");
  return out;
}

namespace {

// The first bytes of a hello, "HVDC" on the wire: a version-1 hello began
// with its rank, so an old rank's frame fails here by name, not by accident.
constexpr uint32_t kHelloMagic = 0x43445648;

}  // namespace

std::string encodeHello(const Hello& hello) {
  // u32 magic, u32 version, then (this version) u32 rank, bytes nonce
  Writer w;
  w.put<uint32_t>(kHelloMagic);
  w.put<uint32_t>(hello.version);
  if (hello.version == kControlProtocolVersion) {
    w.put<uint32_t>(hello.rank);
    w.putString(hello.nonce);
  }
  return std::move(w.buffer());
}

Hello decodeHello(const std::string& frame) {
  Reader r(frame);
  if (r.get<uint32_t>() != kHelloMagic) {
    throw WireError("not a hello of control protocol version 2 or later (version 1 sent the secret)");
  }
  Hello h;
  h.version = r.get<uint32_t>();
  if (h.version != kControlProtocolVersion) return h;  // its fields are not ours to read
  h.rank = r.get<uint32_t>();
  h.nonce = r.getString();
  if (!r.done()) throw WireError("trailing bytes in a hello");
  return h;
}

std::string encodeChallenge(const Challenge& c) {
  // u32 version, then (this version) bytes nonce, bytes proof
  Writer w;
  w.put<uint32_t>(c.version);
  if (c.version == kControlProtocolVersion) {
    w.putString(c.nonce);
    w.putString(c.proof);
  }
  return std::move(w.buffer());
}

Challenge decodeChallenge(const std::string& frame) {
  Reader r(frame);
  Challenge c;
  c.version = r.get<uint32_t>();
  if (c.version != kControlProtocolVersion) return c;
  c.nonce = r.getString();
  c.proof = r.getString();
  if (!r.done()) throw WireError("trailing bytes in a challenge");
  return c;
}

std::string encodeProof(const std::string& proof) {
  Writer w;
  w.putString(proof);
  return std::move(w.buffer());
}

std::string decodeProof(const std::string& frame) {
  Reader r(frame);
  std::string proof = r.getString();
  if (!r.done()) throw WireError("trailing bytes in a proof");
  return proof;
}

}  // namespace hvd
