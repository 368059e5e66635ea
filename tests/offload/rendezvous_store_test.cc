// Who may talk to a data-parallel job (issue 43): rank 0's rendezvous store
// (offload/rendezvous_store.h) keeps c10d TCPStore's semantics, listens on the rendezvous
// address only, refuses ranks without the job's token, survives strangers writing junk to its
// port, and a rank that finds a listener that never answers fails within the timeout naming
// host:port. Ranks are threads of this process, as in collective_test.cc.
#include "offload/rendezvous_store.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "third_party/torch/torch_api.h"

#include "gtest/gtest.h"
#include "offload/collective.h"
#include "tests/free_port.h"
#include "tests/test_files.h"

namespace lspo::offload {
namespace {

using tests::FreePort;

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

CollectiveOptions Options(int rank, int world, int port, absl::Duration timeout) {
  CollectiveOptions o;
  o.rank = rank;
  o.world_size = world;
  o.port = port;
  o.timeout = timeout;
  o.fingerprint = "job-a";
  o.label = "rank" + std::to_string(rank) + "-host";
  return o;
}

// A token file of mode `mode` under the test's scratch folder.
std::string TokenFile(const std::string& name, const std::string& token, mode_t mode = 0600) {
  const std::string path = tests::TempFile(name, token + "\n");
  chmod(path.c_str(), mode);
  return path;
}

// Whether a TCP connection to ip:port (IPv4) is accepted.
bool Connects(const std::string& ip, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, ip.c_str(), &addr.sin_addr);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

// Waits (at most 10 s) until something listens on 127.0.0.1:port.
bool AwaitListener(int port) {
  const auto t0 = std::chrono::steady_clock::now();
  while (Seconds(t0) < 10) {
    if (Connects("127.0.0.1", port)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// An IPv4 address of this host that is not loopback (what `hostname -I` lists first); "" if
// the host has none.
std::string OtherAddressOfThisHost() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* a = list; a != nullptr && found.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if ((ntohl(v4->sin_addr.s_addr) >> 24) == 127) continue;
    char text[INET_ADDRSTRLEN] = {0};
    inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
    found = text;
  }
  freeifaddrs(list);
  return found;
}

// Runs Join on a detached thread and waits at most `bound` for it: a hang fails the test
// instead of hanging it (the thread is then left behind, blocked).
absl::Status JoinWithin(const CollectiveOptions& o, double bound, double* took) {
  auto done = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> result = done->get_future();
  const auto t0 = std::chrono::steady_clock::now();
  std::thread([o, done] { done->set_value(Collective::Join(o).status()); }).detach();
  if (result.wait_for(std::chrono::duration<double>(bound)) != std::future_status::ready) {
    *took = Seconds(t0);
    return absl::DeadlineExceededError("Join did not return: it hangs");
  }
  *took = Seconds(t0);
  return result.get();
}

// The same operations on c10d's TCPStore and on RendezvousStore give the same results
// (values, sums, compareSet's answers, key counts, and a throw where TCPStore throws).
TEST(RendezvousStoreTest, OperationsBehaveAsTcpStores) {
  const auto timeout = std::chrono::milliseconds(500);
  c10d::TCPStoreOptions so;
  so.port = 0;
  so.isServer = true;
  so.numWorkers = 1;
  so.waitWorkers = false;
  so.timeout = std::chrono::seconds(10);  // for its own client's connection
  auto tcp = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  tcp->setTimeout(timeout);

  auto server = RendezvousServer::Start("127.0.0.1", 0, "the-job-token-0123456789");
  ASSERT_TRUE(server.ok()) << server.status();
  RendezvousClientOptions co;
  co.port = (*server)->port();
  co.token = "the-job-token-0123456789";
  co.token_source = "test";
  co.timeout = absl::Milliseconds(500);
  auto ours = RendezvousStore::Connect(co);
  ASSERT_TRUE(ours.ok()) << ours.status();

  auto text = [](const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); };
  auto bytes = [](const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); };
  // `other`: a second client of the same store (TCPStore's client is not safe to share
  // between a thread that waits and one that sets).
  auto run = [&](const c10::intrusive_ptr<c10d::Store>& store,
                 const c10::intrusive_ptr<c10d::Store>& other) {
    c10d::Store& s = *store;
    std::vector<std::string> out;
    auto record = [&](const std::string& what, const std::function<std::string()>& op) {
      try {
        out.push_back(what + " -> " + op());
      } catch (const std::exception&) {
        out.push_back(what + " -> throws");
      }
    };
    const int64_t keys0 = s.getNumKeys();
    record("set a", [&] {
      s.set("a", bytes("1"));
      return std::string("ok");
    });
    record("get a", [&] { return text(s.get("a")); });
    record("set a again", [&] {
      s.set("a", bytes("two"));
      return text(s.get("a"));
    });
    record("get missing", [&] { return text(s.get("missing")); });
    record("add n 5", [&] { return std::to_string(s.add("n", 5)); });
    record("add n -2", [&] { return std::to_string(s.add("n", -2)); });
    record("get n", [&] { return text(s.get("n")); });
    record("cas missing, expected ''", [&] { return text(s.compareSet("c1", {}, bytes("new"))); });
    record("get c1", [&] { return text(s.get("c1")); });
    record("cas missing, expected 'x'",
           [&] { return text(s.compareSet("c2", bytes("x"), bytes("y"))); });
    record("check c2", [&] { return std::to_string(s.check({"c2"})); });
    record("cas equal", [&] { return text(s.compareSet("c1", bytes("new"), bytes("newer"))); });
    record("cas unequal", [&] { return text(s.compareSet("c1", bytes("nope"), bytes("z"))); });
    record("check a n", [&] { return std::to_string(s.check({"a", "n"})); });
    record("check a missing", [&] { return std::to_string(s.check({"a", "missing"})); });
    record("keys", [&] { return std::to_string(s.getNumKeys() - keys0); });
    record("delete a", [&] { return std::to_string(s.deleteKey("a")); });
    record("delete a again", [&] { return std::to_string(s.deleteKey("a")); });
    record("keys after delete", [&] { return std::to_string(s.getNumKeys() - keys0); });
    record("wait n c1", [&] {
      s.wait({"n", "c1"});
      return std::string("ok");
    });
    // A wait that a set by another client ends.
    std::thread later([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      other->set("late", bytes("here"));
    });
    record("wait late", [&] {
      s.wait({"late"}, std::chrono::milliseconds(5000));
      return text(s.get("late"));
    });
    later.join();
    record("other sees n", [&] { return text(other->get("n")); });
    // Through a PrefixStore, as ProcessGroupGloo uses it.
    c10d::PrefixStore prefixed("lspo/gloo", store);
    record("prefixed set get", [&] {
      prefixed.set("0", bytes("addr"));
      return text(prefixed.get("0")) + " " + std::to_string(s.check({"lspo/gloo/0"}));
    });
    // Last: TCPStore's client is not usable after a wait that timed out.
    record("wait missing 200 ms", [&] {
      s.wait({"n", "missing"}, std::chrono::milliseconds(200));
      return std::string("ok");
    });
    return out;
  };
  const auto t0 = std::chrono::steady_clock::now();
  c10d::TCPStoreOptions client_options = so;
  client_options.isServer = false;
  client_options.port = tcp->getPort();
  auto tcp_client = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", client_options);
  tcp_client->setTimeout(timeout);
  const std::vector<std::string> expected = run(tcp, tcp_client);
  const std::vector<std::string> got = run(*ours, (*ours)->clone());
  EXPECT_EQ(got, expected);
  for (const std::string& line : got) std::printf("  %s\n", line.c_str());
  EXPECT_LT(Seconds(t0), 20.0);

  // get blocks until the key exists, then times out after the store's timeout.
  const auto t1 = std::chrono::steady_clock::now();
  try {
    (*ours)->get("never");
    ADD_FAILURE() << "get of a missing key returned";
  } catch (const RendezvousStoreError& e) {
    EXPECT_EQ(e.status().code(), absl::StatusCode::kDeadlineExceeded) << e.status();
    EXPECT_NE(std::string(e.status().message()).find("never"), std::string::npos) << e.status();
  }
  EXPECT_GE(Seconds(t1), 0.45);
  EXPECT_LT(Seconds(t1), 5.0);
}

// With the rendezvous on 127.0.0.1, rank 0's store is not reachable on the host's other
// addresses (TCPStore listened on every interface).
TEST(RendezvousStoreTest, TheStoreListensOnTheRendezvousAddressOnly) {
  if (!CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo (libgloo-dev)";
  const std::string other = OtherAddressOfThisHost();
  if (other.empty()) GTEST_SKIP() << "this host has no IPv4 address but loopback";
  const int port = FreePort();
  // Both groups live until both joins returned: a rank whose group is destroyed at once closes
  // its Gloo connections while the other may still be making its own (flaky under load).
  absl::StatusOr<std::unique_ptr<Collective>> c0, c1;
  bool reachable_on_loopback = false, reachable_elsewhere = true;
  std::thread rank0([&] { c0 = Collective::Join(Options(0, 2, port, absl::Seconds(20))); });
  reachable_on_loopback = AwaitListener(port);
  reachable_elsewhere = Connects(other, port);
  std::thread rank1([&] { c1 = Collective::Join(Options(1, 2, port, absl::Seconds(20))); });
  rank0.join();
  rank1.join();
  const absl::Status st0 = c0.status(), st1 = c1.status();
  EXPECT_TRUE(reachable_on_loopback) << "rank 0's store never listened on 127.0.0.1:" << port;
  EXPECT_FALSE(reachable_elsewhere) << "rank 0's store is reachable at " << other << ":" << port
                                    << " although the rendezvous is 127.0.0.1";
  EXPECT_TRUE(st0.ok()) << st0;
  EXPECT_TRUE(st1.ok()) << st1;
}

// A rank with a wrong token (or none) is refused at once, naming its token file; rank 0 goes on
// and the right ranks form the group.
TEST(RendezvousStoreTest, ARankWithAWrongTokenIsRefusedAndTheGroupStillForms) {
  if (!CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo (libgloo-dev)";
  const std::string right = TokenFile("right_token", "0123456789abcdef0123456789abcdef");
  const std::string wrong = TokenFile("wrong_token", "fedcba9876543210fedcba9876543210");
  const int port = FreePort();
  absl::Status st0, st1, sum_status;
  float sum = 0;
  std::thread rank0([&] {
    CollectiveOptions o = Options(0, 2, port, absl::Seconds(20));
    o.secret_file = right;
    auto c = Collective::Join(o);
    st0 = c.status();
    if (!c.ok()) return;
    at::Tensor x = at::ones({8});
    sum_status = (*c)->AllReduceSum(x);
    sum = x[0].item<float>();
  });
  ASSERT_TRUE(AwaitListener(port));

  // A stranger with the wrong token, then one without any: refused, quickly, naming the file.
  CollectiveOptions stranger = Options(1, 2, port, absl::Seconds(20));
  stranger.secret_file = wrong;
  stranger.label = "stranger";
  double took = 0;
  absl::Status s = JoinWithin(stranger, 30, &took);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find(
                "refused this rank's token (distributed.rendezvous_token_file=" + wrong + ")"),
            std::string::npos)
      << s;
  EXPECT_LT(took, 10.0) << "a wrong token must be refused at once, not after the timeout";
  stranger.secret_file.clear();
  s = JoinWithin(stranger, 30, &took);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("requires the job's token and this rank has none"), std::string::npos)
      << s;
  EXPECT_LT(took, 10.0);

  // The real rank 1 joins: the strangers left no trace (rank 1 is not taken).
  CollectiveOptions o1 = Options(1, 2, port, absl::Seconds(20));
  o1.secret_file = right;
  std::thread rank1([&] {
    auto c = Collective::Join(o1);
    st1 = c.status();
    if (!c.ok()) return;
    at::Tensor x = at::ones({8});
    (void)(*c)->AllReduceSum(x);
  });
  rank0.join();
  rank1.join();
  EXPECT_TRUE(st0.ok()) << st0;
  EXPECT_TRUE(st1.ok()) << st1;
  EXPECT_TRUE(sum_status.ok()) << sum_status;
  EXPECT_EQ(sum, 2.0f);
}

// The token file follows the services' rules for secrets; a non-loopback rendezvous needs a
// token and distributed.allow_remote, refused before anything listens.
TEST(RendezvousStoreTest, TokenFilesAndRemoteRendezvousAreChecked) {
  if (!CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo (libgloo-dev)";
  CollectiveOptions o = Options(0, 2, FreePort(), absl::Seconds(20));
  o.secret_file = TokenFile("open_token", "0123456789abcdef0123456789abcdef", 0644);
  auto c = Collective::Join(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition) << c.status();
  EXPECT_NE(c.status().message().find("chmod 600"), std::string::npos) << c.status();
  o.secret_file = TokenFile("empty_token", "  ");
  c = Collective::Join(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  o.secret_file = ::testing::TempDir() + "/no_such_token";
  c = Collective::Join(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound) << c.status();
  EXPECT_NE(c.status().message().find("distributed.rendezvous_token_file="), std::string::npos)
      << c.status();

  const auto t0 = std::chrono::steady_clock::now();
  for (const std::string& host : {std::string("0.0.0.0"), OtherAddressOfThisHost()}) {
    if (host.empty()) continue;
    o = Options(0, 2, FreePort(), absl::Seconds(20));
    o.host = host;
    c = Collective::Join(o);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition) << c.status();
    EXPECT_NE(c.status().message().find("distributed.allow_remote: true and "
                                        "distributed.rendezvous_token_file"),
              std::string::npos)
        << c.status();
    o.allow_remote = true;
    c = Collective::Join(o);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition) << c.status();
    EXPECT_EQ(c.status().message().find("distributed.allow_remote"), std::string::npos)
        << c.status();
    EXPECT_NE(c.status().message().find("distributed.rendezvous_token_file"), std::string::npos)
        << c.status();
    o.allow_remote = false;
    o.secret_file = TokenFile("remote_token", "0123456789abcdef0123456789abcdef");
    c = Collective::Join(o);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition) << c.status();
    EXPECT_NE(c.status().message().find("distributed.allow_remote: true"), std::string::npos)
        << c.status();
  }
  EXPECT_LT(Seconds(t0), 5.0);  // refused before any rendezvous

  // A rank with a token refuses a store without one (rank 0 started without the token file).
  {
    const int port = FreePort();
    absl::StatusOr<std::unique_ptr<Collective>> c0, c1;  // alive until both joined
    std::thread rank0([&] { c0 = Collective::Join(Options(0, 2, port, absl::Seconds(20))); });
    ASSERT_TRUE(AwaitListener(port));
    CollectiveOptions with_token = Options(1, 2, port, absl::Seconds(20));
    with_token.secret_file = TokenFile("rank1_token", "0123456789abcdef0123456789abcdef");
    double took = 0;
    const absl::Status s = JoinWithin(with_token, 30, &took);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_NE(s.message().find("takes no token but this rank has one"), std::string::npos) << s;
    std::thread rank1([&] { c1 = Collective::Join(Options(1, 2, port, absl::Seconds(20))); });
    rank0.join();
    rank1.join();
    EXPECT_TRUE(c0.ok()) << c0.status();
    EXPECT_TRUE(c1.ok()) << c1.status();
  }

  // Both given, on an address of this host that is not loopback: the group forms there.
  const std::string other = OtherAddressOfThisHost();
  if (other.empty()) GTEST_SKIP() << "this host has no IPv4 address but loopback";
  const int port = FreePort();
  const std::string token = TokenFile("remote_token", "0123456789abcdef0123456789abcdef");
  absl::StatusOr<std::unique_ptr<Collective>> joined[2];  // alive until both joined
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      CollectiveOptions ro = Options(r, 2, port, absl::Seconds(20));
      ro.host = other;
      ro.allow_remote = true;
      ro.secret_file = token;
      joined[r] = Collective::Join(ro);
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_TRUE(joined[0].ok()) << joined[0].status();
  EXPECT_TRUE(joined[1].ok()) << joined[1].status();
}

// Junk on the port (a raw TCP client, a half-open connection, an HTTP/1 request) neither
// crashes rank 0 nor keeps the group from forming.
TEST(RendezvousStoreTest, JunkOnThePortDoesNotDisturbRankZero) {
  if (!CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo (libgloo-dev)";
  const std::string token = TokenFile("junk_token", "0123456789abcdef0123456789abcdef");
  const int port = FreePort();
  absl::Status st0, st1;
  float sum0 = 0;
  std::thread rank0([&] {
    CollectiveOptions o = Options(0, 2, port, absl::Seconds(20));
    o.secret_file = token;
    auto c = Collective::Join(o);
    st0 = c.status();
    if (!c.ok()) return;
    at::Tensor x = at::ones({8});
    if (st0 = (*c)->AllReduceSum(x); st0.ok()) sum0 = x[0].item<float>();
  });
  ASSERT_TRUE(AwaitListener(port));
  std::vector<int> held;
  for (int i = 0; i < 6; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    std::string junk;
    if (i == 0) junk = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    if (i == 1) junk = std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") + std::string(64, '\xff');
    if (i == 2) {
      for (int b = 0; b < 65536; ++b) junk.push_back(static_cast<char>((b * 131 + 7) & 0xff));
    }
    // i == 4, 5: what c10d's TCPStore would read as a set or a get of a key 2^62 or 2^64 - 1
    // bytes long (query type byte, then a 64-bit length).
    if (i == 4) junk = std::string("\x00", 1) + std::string("\x00\x00\x00\x00\x00\x00\x00\x40", 8);
    if (i == 5) junk = std::string("\x02", 1) + std::string(8, '\xff');
    // i == 3: connected, sends nothing, stays open.
    if (!junk.empty()) (void)!send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
    if (i == 3) {
      held.push_back(fd);
    } else {
      close(fd);
    }
  }
  std::thread rank1([&] {
    CollectiveOptions o = Options(1, 2, port, absl::Seconds(20));
    o.secret_file = token;
    auto c = Collective::Join(o);
    st1 = c.status();
    if (!c.ok()) return;
    at::Tensor x = at::ones({8});
    st1 = (*c)->AllReduceSum(x);
  });
  rank0.join();
  rank1.join();
  for (int fd : held) close(fd);
  EXPECT_TRUE(st0.ok()) << st0;
  EXPECT_TRUE(st1.ok()) << st1;
  EXPECT_EQ(sum0, 2.0f);
}

// Something that accepts connections on the rendezvous port but never answers (a stale or
// foreign server): the joining rank fails within its timeout, naming host:port (TCPStore's
// client waited past the timeout).
TEST(RendezvousStoreTest, AListenerThatNeverAnswersFailsTheJoinWithinTheTimeout) {
  if (!CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo (libgloo-dev)";
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 16), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  // Accepts every connection and keeps it open without a byte in answer.
  std::atomic<bool> stop{false};
  std::vector<int> accepted;
  std::thread acceptor([&] {
    while (!stop.load()) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 50) == 1) {
        const int c = accept(fd, nullptr, nullptr);
        if (c >= 0) accepted.push_back(c);
      }
    }
  });
  double took = 0;
  const absl::Status s = JoinWithin(Options(1, 2, port, absl::Seconds(2)), 30, &took);
  stop = true;
  acceptor.join();
  for (int c : accepted) close(c);
  close(fd);
  std::printf("after %.2f s: %s\n", took, s.ToString().c_str());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("127.0.0.1:" + std::to_string(port)), std::string::npos) << s;
  EXPECT_NE(s.message().find("accepts connections but did not answer"), std::string::npos) << s;
  EXPECT_GE(took, 1.5);
  EXPECT_LT(took, 10.0) << "the 2 s timeout did not bound the join";
}

}  // namespace
}  // namespace lspo::offload
