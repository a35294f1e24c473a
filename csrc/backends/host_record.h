// What each member of a set publishes before the set picks its data plane:
// the switches every member must agree on and its host as the launcher
// names it. Encoded with wire.h, so a host name holding any byte reads back
// whole and a cut record is a WireError, not a misread.
#pragma once

#include <cstdint>
#include <string>

#include "../core/wire.h"

namespace hvd {

struct HostRecord {
  bool shm = false;           // HVD_TORCH_SHM
  bool split_reduce = false;  // HOROVOD_HIERARCHICAL_ALLREDUCE
  bool split_gather = false;  // HOROVOD_HIERARCHICAL_ALLGATHER
  std::string host;

  bool sameSwitches(const HostRecord& o) const {
    return shm == o.shm && split_reduce == o.split_reduce && split_gather == o.split_gather;
  }

  std::string encode() const {
    Writer w;
    w.put<uint8_t>(shm);
    w.put<uint8_t>(split_reduce);
    w.put<uint8_t>(split_gather);
    w.putString(host);
    return std::move(w.buffer());
  }

  static HostRecord decode(const std::string& bytes) {
    Reader r(bytes);
    HostRecord h;
    h.shm = r.get<uint8_t>() != 0;
    h.split_reduce = r.get<uint8_t>() != 0;
    h.split_gather = r.get<uint8_t>() != 0;
    h.host = r.getString();
    if (!r.done()) throw WireError("trailing bytes in a host record");
    return h;
  }
};

}  // namespace hvd
