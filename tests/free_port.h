// A loopback TCP port for tests that start servers or rendezvous stores whose port another
// party must know in advance. Header-only; in Bazel part of //tests:test_files (linked into
// every lspo_test).
#ifndef LSPO_TESTS_FREE_PORT_H_
#define LSPO_TESTS_FREE_PORT_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace lspo::tests {

// A port of 127.0.0.1 that was free a moment ago (bound to port 0, read back, closed); 0 if no
// socket could be bound. Another process may take it before the caller does.
inline int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

}  // namespace lspo::tests

#endif  // LSPO_TESTS_FREE_PORT_H_
