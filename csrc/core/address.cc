#include "address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>

#include "wire.h"

namespace hvd {

namespace {

std::string interfaceAddress(const std::string& iface, const std::string& hostname) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    throw std::runtime_error(std::string("getifaddrs failed: ") + std::strerror(errno));
  }
  std::string found;
  bool exists = false;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (iface != it->ifa_name) continue;
    exists = true;
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN];
    auto* in = reinterpret_cast<sockaddr_in*>(it->ifa_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) != nullptr) {
      found = text;
      break;
    }
  }
  freeifaddrs(list);
  if (found.empty()) {
    throw std::runtime_error("HOROVOD_GLOO_IFACE=" + iface + ": host " + hostname +
                             (exists ? " has this interface but no IPv4 address on it"
                                     : " has no such network interface"));
  }
  return found;
}

// connect() on a UDP socket sends nothing: it only asks the kernel to pick
// the route, whose source address getsockname() then reports.
std::string routeSourceAddress(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return "";
  std::string out;
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    char text[INET_ADDRSTRLEN];
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text)) != nullptr) {
      out = text;
    }
  }
  if (fd >= 0) ::close(fd);
  freeaddrinfo(res);
  return out;
}

}  // namespace

std::string localAddress(const EngineConfig& config) {
  if (!config.iface.empty()) return interfaceAddress(config.iface, config.hostname);
  if (!config.store_host.empty()) {
    std::string address = routeSourceAddress(config.store_host, config.store_port);
    if (!address.empty()) return address;
  }
  return config.hostname;
}

std::string Endpoint::encode() const { return host + ":" + std::to_string(port); }

Endpoint Endpoint::decode(const std::string& text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos) throw WireError("control address without a port: " + text);
  Endpoint e;
  e.host = text.substr(0, colon);
  // Decimal digits only, no sign, no leading zero: what encode() writes.
  const std::string digits = text.substr(colon + 1);
  long port = 0;
  bool ok = !digits.empty() && digits.size() <= 5 && digits[0] != '0';
  for (char c : digits) {
    ok = ok && c >= '0' && c <= '9';
    if (ok) port = port * 10 + (c - '0');
  }
  if (!ok || port > 65535) throw WireError("control address with a bad port: " + text);
  e.port = static_cast<int>(port);
  return e;
}

}  // namespace hvd
