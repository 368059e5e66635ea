// A loopback TCP port for tests that start servers or rendezvous stores whose port another
// party must know in advance. Header-only; in Bazel part of //tests:test_files (linked into
// every lspo_test).
#ifndef LSPO_TESTS_FREE_PORT_H_
#define LSPO_TESTS_FREE_PORT_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <random>

namespace lspo::tests {

// A port of 127.0.0.1 that was free a moment ago (bound, then closed); 0 if none could be
// bound. Drawn at random below the kernel's ephemeral range (/proc/sys/net/ipv4/
// ip_local_port_range, 32768-60999 by default): a port that bind(0) hands out is an ephemeral
// one, which the outgoing connections of tests running beside this one (gRPC, Gloo) are also
// given, so such a port is often taken again between the pick and the server's bind. Another
// process may still take this one first, but only by drawing the same number.
inline int FreePort() {
  int low = 32768, high = 60999;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &low, &high) != 2) low = 32768;
    std::fclose(f);
  }
  const int top = low - 1, bottom = low - 1 > 12000 ? low - 10000 : 1024;
  std::random_device seed;
  std::mt19937 draw(seed() ^ static_cast<unsigned>(getpid()));
  std::uniform_int_distribution<int> pick(bottom, top > bottom ? top : bottom + 1);
  for (int attempt = 0; attempt < 64; ++attempt) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const int port = pick(draw);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    if (free) return port;
  }
  return 0;
}

}  // namespace lspo::tests

#endif  // LSPO_TESTS_FREE_PORT_H_
