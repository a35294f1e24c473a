// What each member of a host's set publishes in the store before they share
// a segment: its host identity (shmHostIdentity(): boot and namespaces) and
// its pid, as text, "identity|pid". Members read each other's: a malformed
// record is a WireError naming it, never a misread pid.
#pragma once

#include <string>

#include "../../core/wire.h"

namespace hvd {

struct ShmPeer {
  std::string identity;  // may hold any byte, '|' included
  int pid = 0;           // > 0

  std::string encode() const { return identity + "|" + std::to_string(pid); }

  static ShmPeer decode(const std::string& text) {
    const size_t bar = text.rfind('|');
    if (bar == std::string::npos)
      throw WireError("shared-memory peer record without a pid: " + text);
    ShmPeer p;
    p.identity = text.substr(0, bar);
    // Decimal digits only, no sign, no leading zero, at most a pid's range
    // (Linux's pid_max is at most 2^22): what encode() writes and nothing else.
    const std::string digits = text.substr(bar + 1);
    long pid = 0;
    bool ok = !digits.empty() && digits.size() <= 9 && digits[0] != '0';
    for (char c : digits) {
      ok = ok && c >= '0' && c <= '9';
      if (ok) pid = pid * 10 + (c - '0');
    }
    if (!ok) throw WireError("shared-memory peer record with a bad pid: " + text);
    p.pid = static_cast<int>(pid);
    return p;
  }
};

}  // namespace hvd
