// offload::Collective and offload::OverlapReducer over loopback (issue 17): two or three ranks
// as threads of this process, each with its own rendezvous client and Gloo connections. Sums
// are checked against float64 sums of the same inputs; faults (a rank that never joins, a
// different job, a rank that leaves or stops answering) must fail within the stated timeout
// with the rank named.
#include "offload/collective.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "third_party/torch/torch_api.h"

#include "gtest/gtest.h"
#include "offload/overlap_reducer.h"
#include "runtime/tfrecord.h"
#include "tests/free_port.h"

namespace lspo::offload {
namespace {

using tests::FreePort;

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

// Runs body(rank) on `world` threads and joins them.
void OnRanks(int world, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(CollectiveTest, WorldSizeOneIsTheIdentityAndNeedsNoNetwork) {
  CollectiveOptions o;
  auto c = Collective::Join(o);
  ASSERT_TRUE(c.ok()) << c.status();
  at::Tensor t = at::arange(6, at::kFloat);
  ASSERT_TRUE((*c)->AllReduceSum(t).ok());
  EXPECT_TRUE(at::equal(t, at::arange(6, at::kFloat)));
  ASSERT_TRUE((*c)->AllReduceMean(t).ok());
  EXPECT_TRUE(at::equal(t, at::arange(6, at::kFloat)));
  auto g = (*c)->AllGather(42);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(*g, std::vector<int64_t>{42});
  EXPECT_EQ((*c)->all_reduce_bytes(), 2 * 6 * 4);
}

TEST(CollectiveTest, BadRankOrWorldSizeIsRefused) {
  CollectiveOptions o;
  o.world_size = 2;
  o.rank = 2;
  auto c = Collective::Join(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("rank 2 with world_size 2"), std::string::npos)
      << c.status();
  o.world_size = 0;
  o.rank = 0;
  EXPECT_EQ(Collective::Join(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CollectiveTest, ThreeRanksSumMeanBroadcastAndGatherMatchFloat64References) {
  if (!CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo (libgloo-dev)";
  const int world = 3;
  const int port = FreePort();
  // Every rank's inputs, and their float64 sums.
  std::vector<at::Tensor> inputs;
  for (int r = 0; r < world; ++r) {
    at::manual_seed(100 + r);
    inputs.push_back(at::randn({64, 48}, at::kFloat));
  }
  at::Tensor ref = at::zeros({64, 48}, at::kDouble);
  for (const auto& x : inputs) ref += x.to(at::kDouble);
  std::vector<at::Tensor> sums(world), means(world), async(world), bcast(world);
  std::vector<std::vector<int64_t>> gathered(world);
  std::vector<int64_t> bytes(world);
  std::vector<absl::Status> errors(world);
  std::vector<std::vector<std::string>> labels(world);
  OnRanks(world, [&](int r) {
    auto c = Collective::Join(Options(r, world, port, absl::Seconds(30)));
    if (!c.ok()) {
      errors[r] = c.status();
      return;
    }
    labels[r] = (*c)->labels();
    sums[r] = inputs[r].clone();
    errors[r].Update((*c)->AllReduceSum(sums[r]));
    means[r] = inputs[r].to(at::kDouble);
    errors[r].Update((*c)->AllReduceMean(means[r]));
    async[r] = inputs[r].clone();
    auto pending = (*c)->StartAllReduceSum(async[r]);
    errors[r].Update(pending.status());
    if (pending.ok()) errors[r].Update((*pending)->Wait());
    bcast[r] = inputs[r].clone();
    errors[r].Update((*c)->Broadcast(bcast[r], 2));
    auto g = (*c)->AllGather(1000 + 7 * r);
    errors[r].Update(g.status());
    if (g.ok()) gathered[r] = *g;
    bytes[r] = (*c)->all_reduce_bytes();
  });
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(errors[r].ok()) << "rank " << r << ": " << errors[r];
    // fp32 sums of three terms: within a few fp32 ulps of the float64 sum.
    EXPECT_LT((sums[r].to(at::kDouble) - ref).abs().max().item<double>(), 1e-5) << r;
    EXPECT_LT((async[r].to(at::kDouble) - ref).abs().max().item<double>(), 1e-5) << r;
    EXPECT_LT((means[r] - ref / world).abs().max().item<double>(), 1e-12) << r;
    EXPECT_TRUE(at::equal(sums[r], sums[0])) << "ranks disagree: " << r;
    EXPECT_TRUE(at::equal(bcast[r], inputs[2])) << r;
    EXPECT_EQ(gathered[r], (std::vector<int64_t>{1000, 1007, 1014})) << r;
    // fp32 sum + fp64 mean + fp32 async sum of 64 x 48 elements.
    EXPECT_EQ(bytes[r], 64 * 48 * (4 + 8 + 4)) << r;
    EXPECT_EQ(labels[r], (std::vector<std::string>{"rank0-host", "rank1-host", "rank2-host"}));
  }
}

TEST(CollectiveTest, ARankOfAnotherJobIsRefusedAtTheRendezvousNamingIt) {
  if (!CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo (libgloo-dev)";
  const int port = FreePort();
  std::vector<absl::Status> st(2);
  OnRanks(2, [&](int r) {
    CollectiveOptions o = Options(r, 2, port, absl::Seconds(30));
    if (r == 1) o.fingerprint = "job-b";
    st[r] = Collective::Join(o).status();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r].code(), absl::StatusCode::kFailedPrecondition) << st[r];
    EXPECT_NE(st[r].message().find("rank 1 (rank1-host) runs a different job than rank 0 "
                                   "(rank0-host): fingerprint job-b vs job-a"),
              std::string::npos)
        << st[r];
  }
}

TEST(CollectiveTest, AMismatchIsExplainedByTheCallerAndSharedResourcesAreRefused) {
  if (!CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo (libgloo-dev)";
  int port = FreePort();
  std::vector<absl::Status> st(2);
  OnRanks(2, [&](int r) {
    CollectiveOptions o = Options(r, 2, port, absl::Seconds(30));
    if (r == 1) o.fingerprint = "job-b";
    o.explain_mismatch = [](const std::string& a, const std::string& b) {
      return a + " became " + b;
    };
    st[r] = Collective::Join(o).status();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r].code(), absl::StatusCode::kFailedPrecondition) << st[r];
    EXPECT_NE(st[r].message().find("than rank 0 (rank0-host): job-a became job-b; start"),
              std::string::npos)
        << st[r];
  }
  // Two ranks that would write into one directory.
  port = FreePort();
  OnRanks(2, [&](int r) {
    CollectiveOptions o = Options(r, 2, port, absl::Seconds(30));
    o.exclusive = "the output directory host:/runs/a";
    st[r] = Collective::Join(o).status();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r].code(), absl::StatusCode::kAlreadyExists) << st[r];
    EXPECT_NE(st[r].message().find("ranks 0 (rank0-host) and 1 (rank1-host) share the output "
                                   "directory host:/runs/a"),
              std::string::npos)
        << st[r];
  }
}

// Two processes started with the same rank: the second to claim it fails at once (not after
// the timeout), and the group of the first forms.
TEST(CollectiveTest, ARankTakenTwiceIsRefusedAtOnce) {
  if (!CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo (libgloo-dev)";
  const int port = FreePort();
  std::vector<absl::Status> st(3);
  std::vector<double> took(3);
  std::atomic<int> returned{0};
  OnRanks(3, [&](int t) {
    const auto t0 = std::chrono::steady_clock::now();
    CollectiveOptions o = Options(t == 0 ? 0 : 1, 2, port, absl::Seconds(20));
    if (t == 2) o.label = "second-rank1";
    auto c = Collective::Join(o);
    st[t] = c.status();
    took[t] = Seconds(t0);
    ++returned;
    if (c.ok()) {  // the group works
      at::Tensor x = at::ones({4});
      st[t] = (*c)->AllReduceSum(x);
      if (st[t].ok() && x[0].item<float>() != 2.0f) st[t] = absl::InternalError("wrong sum");
      // Rank 0's store must outlive the late claimant's Join (a loaded machine can start that
      // thread after the group formed): otherwise it finds no store instead of a taken rank.
      while (returned.load() < 3 && Seconds(t0) < 30) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  });
  EXPECT_TRUE(st[0].ok()) << st[0];
  const int loser = st[1].ok() ? 2 : 1;
  EXPECT_TRUE(st[3 - loser].ok()) << st[3 - loser];
  EXPECT_EQ(st[loser].code(), absl::StatusCode::kAlreadyExists) << st[loser];
  EXPECT_NE(st[loser].message().find("rank 1 ("), std::string::npos) << st[loser];
  EXPECT_NE(st[loser].message().find("is already taken in the group at 127.0.0.1:" +
                                     std::to_string(port)),
            std::string::npos)
      << st[loser];
  EXPECT_LT(took[loser], 10.0);  // at once, not the 20 s timeout
}

TEST(CollectiveTest, ABadBindAddressOrHugeWorldIsRefusedBeforeTheRendezvous) {
  if (!CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo (libgloo-dev)";
  CollectiveOptions o = Options(1, 2, FreePort(), absl::Seconds(30));
  const auto t0 = std::chrono::steady_clock::now();
  o.bind_address = "127.0.0.1:29501";
  auto c = Collective::Join(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  EXPECT_NE(c.status().message().find("bind_address '127.0.0.1:29501' has a port"),
            std::string::npos)
      << c.status();
  o.bind_address = "192.0.2.55";  // TEST-NET-1 (RFC 5737): an address of no host here
  c = Collective::Join(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  EXPECT_NE(c.status().message().find("'192.0.2.55' is not an address of this host"),
            std::string::npos)
      << c.status();
  EXPECT_LT(Seconds(t0), 5.0);  // no rendezvous was tried (it would wait the 30 s)
  o = Options(0, kMaxWorldSize + 1, 0, absl::Seconds(1));
  EXPECT_EQ(Collective::Join(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CollectiveTest, ARankThatNeverJoinsFailsTheOthersWithinTheTimeout) {
  if (!CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo (libgloo-dev)";
  const auto t0 = std::chrono::steady_clock::now();
  auto c = Collective::Join(Options(0, 3, FreePort(), absl::Seconds(2)));
  const double took = Seconds(t0);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded) << c.status();
  EXPECT_NE(c.status().message().find("ranks 1, 2 of 3 did not join"), std::string::npos)
      << c.status();
  EXPECT_GE(took, 1.5);
  EXPECT_LT(took, 30.0);  // bounded: the 2 s timeout, not a hang
}

TEST(CollectiveTest, NoStoreAtTheRendezvousIsNamed) {
  if (!CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo (libgloo-dev)";
  const int port = FreePort();
  auto c = Collective::Join(Options(1, 2, port, absl::Seconds(2)));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_NE(c.status().message().find("cannot reach the rendezvous store at 127.0.0.1:" +
                                      std::to_string(port)),
            std::string::npos)
      << c.status();
}

// A rank that leaves (its connections close) and a rank that stays but stops answering: the
// other rank's all-reduce fails, names every rank, and later calls fail at once.
TEST(CollectiveTest, ALeftOrSilentRankFailsTheCollectiveWithinTheTimeout) {
  if (!CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo (libgloo-dev)";
  for (const bool silent : {false, true}) {
    const int port = FreePort();
    absl::Status st0, later;
    double took = 0;
    OnRanks(2, [&](int r) {
      auto c = Collective::Join(Options(r, 2, port, absl::Seconds(2)));
      ASSERT_TRUE(c.ok()) << c.status();
      if (r == 1) {
        // Silent: alive past rank 0's timeout, never calling; else gone at once.
        if (silent) std::this_thread::sleep_for(std::chrono::seconds(4));
        return;
      }
      at::Tensor t = at::ones({1024}, at::kFloat);
      const auto t0 = std::chrono::steady_clock::now();
      st0 = (*c)->AllReduceSum(t);
      took = Seconds(t0);
      later = (*c)->AllReduceSum(t);
    });
    std::printf("%s rank, after %.2f s: %s\n", silent ? "silent" : "left", took,
                st0.ToString().c_str());
    EXPECT_EQ(st0.code(), absl::StatusCode::kUnavailable) << st0;
    EXPECT_NE(st0.message().find("all-reduce of 4096 bytes on rank 0 of 2 failed"),
              std::string::npos)
        << st0;
    EXPECT_NE(st0.message().find("Ranks: 0 = rank0-host, 1 = rank1-host"), std::string::npos)
        << st0;
    EXPECT_LT(took, 30.0) << (silent ? "silent" : "left");
    EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition) << later;
    EXPECT_NE(later.message().find("the group is broken"), std::string::npos) << later;
  }
}

TEST(CollectiveTest, OnlyContiguousCpuTensorsOfSupportedDtypes) {
  CollectiveOptions o;
  auto c = Collective::Join(o);
  ASSERT_TRUE(c.ok());
  at::Tensor half = at::ones({4}, at::kHalf);
  EXPECT_EQ((*c)->AllReduceSum(half).code(), absl::StatusCode::kInvalidArgument);
  at::Tensor strided = at::ones({4, 4}, at::kFloat).t();
  EXPECT_EQ((*c)->AllReduceSum(strided).code(), absl::StatusCode::kInvalidArgument);
  at::Tensor ints = at::ones({4}, at::kLong);
  EXPECT_EQ((*c)->AllReduceMean(ints).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CollectiveTest, SumTensorsAcrossRanksSumsAListCountingTheMissingOnes) {
  if (!CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo (libgloo-dev)";
  const int world = 2;
  const int port = FreePort();
  // Rank 0: a (bf16, 3x4) and no second tensor; rank 1: a' (bf16) and b (fp32, 5).
  at::manual_seed(7);
  const at::Tensor a0 = at::randn({3, 4}).to(at::kBFloat16),
                   a1 = at::randn({3, 4}).to(at::kBFloat16);
  const at::Tensor b1 = at::randn({5}, at::kFloat);
  std::vector<std::vector<at::Tensor>> out(world);
  std::vector<absl::StatusOr<int64_t>> missing(world, absl::UnknownError("not run"));
  std::vector<int64_t> bytes(world);
  OnRanks(world, [&](int r) {
    auto c = Collective::Join(Options(r, world, port, absl::Seconds(30)));
    if (!c.ok()) {
      missing[r] = c.status();
      return;
    }
    out[r] = r == 0 ? std::vector<at::Tensor>{a0.clone(), at::Tensor()}
                    : std::vector<at::Tensor>{a1.clone(), b1.clone()};
    missing[r] = SumTensorsAcrossRanks(**c, out[r], {12, 5});
    bytes[r] = (*c)->all_reduce_bytes();
  });
  // The sum of the two bf16 inputs, rounded once to bf16 (the fp32 sum of two bf16 values is
  // exact); rank 0's missing tensor counts as zeros and arrives as fp32 {5}.
  const at::Tensor ref_a = (a0.to(at::kDouble) + a1.to(at::kDouble)).to(at::kBFloat16);
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(missing[r].ok()) << "rank " << r << ": " << missing[r].status();
    EXPECT_EQ(*missing[r], 1) << r;
    EXPECT_EQ(out[r][0].scalar_type(), at::kBFloat16) << r;
    EXPECT_TRUE(at::equal(out[r][0], ref_a)) << r;
    EXPECT_EQ(out[r][1].sizes(), at::IntArrayRef({5})) << r;
    EXPECT_TRUE(at::equal(out[r][1].to(at::kFloat), b1)) << r;
    EXPECT_EQ(bytes[r], (1 + 12 + 5) * 4) << r;  // one fp32 buffer, count element included
  }
}

// Resume agreement (issue 43): three ranks, each with the checkpoints it committed and
// verified; they agree on the newest step all of them hold (the reference: the intersection's
// maximum), whatever each one's own newest is; none at all is 0; none in common is refused
// naming each rank's newest.
TEST(CollectiveTest, RanksAgreeOnTheNewestCheckpointAllOfThemHold) {
  if (!CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo (libgloo-dev)";
  const int world = 3;
  struct Case {
    std::vector<std::vector<int>> held;
    int want;  // -1: refused
  };
  const std::vector<Case> cases = {
      {{{3, 6}, {3}, {6, 3}}, 3},              // rank 1 died before committing 6
      {{{9, 6, 3}, {6, 3, 9}, {9, 3, 6}}, 9},  // all committed 9
      {{{2, 4, 6, 8}, {1, 4, 8}, {4, 7, 8, 3}}, 8},
      {{{10, 8, 5}, {9, 7, 5}, {8, 6, 5, 4}}, 5},  // several rounds: 10/9/8 -> 8 -> 5
      {{{}, {}, {}}, 0},                       // nothing anywhere: start afresh
      {{{4}, {}, {4}}, -1},                    // rank 1 holds none
      {{{4, 2}, {3}, {4}}, -1},                // no step in common
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    std::set<int> common(c.held[0].begin(), c.held[0].end());
    for (int r = 1; r < world; ++r) {
      std::set<int> next;
      for (int s : c.held[r]) {
        if (common.count(s)) next.insert(s);
      }
      common = next;
    }
    const bool anything = !c.held[0].empty() || !c.held[1].empty() || !c.held[2].empty();
    const int reference = !common.empty() ? *common.rbegin() : anything ? -1 : 0;
    ASSERT_EQ(reference, c.want) << "case " << k << ": the table's expectation is wrong";
    const int port = FreePort();
    std::vector<absl::StatusOr<int>> got(world, absl::UnknownError("not run"));
    // The groups outlive every rank's last collective (one destroyed early closes its
    // connections while another may still be finishing).
    std::vector<std::unique_ptr<Collective>> groups(world);
    OnRanks(world, [&](int r) {
      auto g = Collective::Join(Options(r, world, port, absl::Seconds(30)));
      if (!g.ok()) {
        got[r] = g.status();
        return;
      }
      groups[r] = std::move(*g);
      got[r] = AgreeOnNewestCommonStep(*groups[r], c.held[r]);
    });
    groups.clear();
    for (int r = 0; r < world; ++r) {
      if (c.want >= 0) {
        ASSERT_TRUE(got[r].ok()) << "case " << k << " rank " << r << ": " << got[r].status();
        EXPECT_EQ(*got[r], c.want) << "case " << k << " rank " << r;
      } else {
        ASSERT_FALSE(got[r].ok()) << "case " << k << " rank " << r << ": agreed " << *got[r];
        EXPECT_EQ(got[r].status().code(), absl::StatusCode::kFailedPrecondition) << got[r].status();
        EXPECT_NE(got[r].status().message().find("rank 1 (rank1-host)"), std::string::npos)
            << got[r].status();
        EXPECT_NE(got[r].status().message().find("resume_from"), std::string::npos)
            << got[r].status();
      }
    }
  }
  // One rank alone agrees with itself; a bad step is refused.
  auto one = Collective::Join(CollectiveOptions());
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(*AgreeOnNewestCommonStep(**one, {5, 2}), 5);
  EXPECT_EQ(AgreeOnNewestCommonStep(**one, {0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CollectiveTest, SumTensorsAcrossRanksRefusesSizesThatDoNotMatch) {
  CollectiveOptions o;
  auto c = Collective::Join(o);
  ASSERT_TRUE(c.ok());
  std::vector<at::Tensor> t{at::ones({2, 3})};
  EXPECT_EQ(SumTensorsAcrossRanks(**c, t, {5}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SumTensorsAcrossRanks(**c, t, {6, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto one = SumTensorsAcrossRanks(**c, t, {6});  // world size 1: the identity
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, 0);
  EXPECT_TRUE(at::equal(t[0], at::ones({2, 3})));
}

TEST(CollectiveTest, BroadcastTensorsSendsRankZerosListAndRefusesOtherSizes) {
  if (!CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo (libgloo-dev)";
  const int world = 2;
  const int port = FreePort();
  // Rank r's list: fp32 (2, 3), int64 (4), fp64 (1), fp32 (5) of its own values; a second
  // list in which rank 1's int64 tensor has 5 elements.
  auto list = [](int r, int64_t ints) {
    return std::vector<at::Tensor>{
        at::full({2, 3}, 1.5f + r), at::arange(ints, at::kLong) * (r + 1),
        at::full({1}, 0.25 * (r + 1), at::kDouble), at::arange(5, at::kFloat) - r};
  };
  std::vector<std::vector<at::Tensor>> got(world), bad(world);
  std::vector<absl::Status> first(world), second(world);
  OnRanks(world, [&](int r) {
    auto c = Collective::Join(Options(r, world, port, absl::Seconds(30)));
    if (!c.ok()) {
      first[r] = second[r] = c.status();
      return;
    }
    got[r] = list(r, 4);
    first[r] = BroadcastTensors(**c, got[r], 0);
    bad[r] = list(r, r == 1 ? 5 : 4);
    second[r] = BroadcastTensors(**c, bad[r], 0);
  });
  const std::vector<at::Tensor> want = list(0, 4);
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(first[r].ok()) << "rank " << r << ": " << first[r];
    ASSERT_EQ(got[r].size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[r][i].scalar_type(), want[i].scalar_type()) << r << " " << i;
      EXPECT_TRUE(at::equal(got[r][i], want[i])) << "rank " << r << " tensor " << i;
    }
    EXPECT_EQ(second[r].code(), absl::StatusCode::kFailedPrecondition) << r << ": " << second[r];
    EXPECT_NE(second[r].message().find("rank 1 (rank1-host) differ in size"), std::string::npos)
        << second[r];
  }
  // Rank 1's mismatched list is left as it was.
  EXPECT_TRUE(at::equal(bad[1][1], at::arange(5, at::kLong) * 2));
}

TEST(CollectiveTest, BroadcastTensorsRefusesOtherDtypes) {
  CollectiveOptions o;
  auto c = Collective::Join(o);
  ASSERT_TRUE(c.ok());
  std::vector<at::Tensor> t{at::ones({2}), at::ones({2}, at::kHalf)};
  absl::Status st = BroadcastTensors(**c, t, 0);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("tensor 1 is Half"), std::string::npos) << st;
}

TEST(CollectiveTest, TensorChecksumIsCrc32cOfTheBytesOrOfThreeSamples) {
  // RFC 3720 (iSCSI), B.4: CRC-32C("123456789") = 0xE3069283.
  const std::string digits = "123456789";
  at::Tensor t = at::empty({9}, at::kByte);
  std::memcpy(t.data_ptr(), digits.data(), 9);
  EXPECT_EQ(Crc32cExtendTensor(0, t), 0xE3069283u);
  EXPECT_EQ(Crc32cExtendTensor(0, t, /*sample_bytes=*/3), 0xE3069283u);  // 9 <= 3 samples: all
  EXPECT_EQ(Crc32cExtendTensor(0xE3069283u, at::Tensor()), 0xE3069283u);
  // 10 bytes, samples of 3: bytes [0, 3) + [3, 6) + [7, 10) = "012" "345" "789".
  at::Tensor ten = at::empty({10}, at::kByte);
  std::memcpy(ten.data_ptr(), "0123456789", 10);
  EXPECT_EQ(Crc32cExtendTensor(0, ten, 3), runtime::Crc32c("012345789"));
  EXPECT_EQ(Crc32cExtendTensor(0, ten), runtime::Crc32c("0123456789"));
  // Non-contiguous tensors are read in logical order.
  at::Tensor m = at::arange(6, at::kInt).view({2, 3});
  EXPECT_EQ(Crc32cExtendTensor(0, m.t()), Crc32cExtendTensor(0, m.t().contiguous()));
  EXPECT_NE(Crc32cExtendTensor(0, m.t()), Crc32cExtendTensor(0, m));
}

// Joins `world` ranks over loopback and runs `body` on each with an OverlapReducer of `shapes`
// and `caps` whose publish callback is `publish(rank, i, sum)`; rank r's status (the join's
// error, or what `body` returns) lands in the r-th entry of the result.
std::vector<absl::Status> OnReducerRanks(
    int world, const std::vector<std::vector<int64_t>>& shapes, OverlapReducer::Buckets caps,
    const std::function<bool(int, int64_t, const at::Tensor&)>& publish,
    const std::function<absl::Status(int, Collective&, OverlapReducer&)>& body) {
  const int port = FreePort();
  std::vector<absl::Status> st(world, absl::UnknownError("not run"));
  OnRanks(world, [&](int r) {
    auto c = Collective::Join(Options(r, world, port, absl::Seconds(30)));
    if (!c.ok()) {
      st[r] = c.status();
      return;
    }
    OverlapReducer reducer(
        c->get(), shapes, [&, r](int64_t i, const at::Tensor& sum) { return publish(r, i, sum); },
        caps);
    st[r] = body(r, **c, reducer);
  });
  return st;
}

// OverlapReducer (the data-parallel sum inside the overlapped backward): two ranks stage their
// matrices in opposite orders (as two autograd engines might); each rank hands on every sum, in
// the order n-1 .. 0, bitwise the float64 sum rounded to fp32 (exact for two fp32 addends), and
// a bf16 input is widened exactly. Caps of 1 and 40 bytes make two buckets: matrix 3 alone
// (24 bytes), then 2, 1 (36 bytes, under the cap) and 0.
TEST(CollectiveTest, OverlapReducerSumsInOneOrderWhateverOrderTheRanksStageIn) {
  if (!CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo (libgloo-dev)";
  const int world = 2;
  const std::vector<std::vector<int64_t>> shapes = {{3, 4}, {5}, {2, 2}, {6, 1}};
  const int64_t n = static_cast<int64_t>(shapes.size());
  at::manual_seed(11);
  std::vector<std::vector<at::Tensor>> in(world);
  for (int r = 0; r < world; ++r) {
    for (const auto& s : shapes) in[r].push_back(at::randn(s, at::kFloat));
  }
  in[1][2] = in[1][2].to(at::kBFloat16);  // a zero-mode gradient arrives in bf16
  std::vector<at::Tensor> ref;
  for (int64_t i = 0; i < n; ++i) {
    ref.push_back((in[0][i].to(at::kDouble) + in[1][i].to(at::kDouble)).to(at::kFloat));
  }
  std::vector<std::vector<int64_t>> order(world);
  std::vector<std::vector<at::Tensor>> sums(world, std::vector<at::Tensor>(n));
  const std::vector<absl::Status> st = OnReducerRanks(
      world, shapes, OverlapReducer::Buckets{1, 40},
      [&](int r, int64_t i, const at::Tensor& sum) {
        order[r].push_back(i);
        sums[r][i] = sum.clone();
        return true;
      },
      [&](int r, Collective&, OverlapReducer& reducer) {
        EXPECT_EQ(reducer.buckets(), (std::vector<std::vector<int64_t>>{{3}, {2, 1, 0}})) << r;
        for (int64_t k = 0; k < n; ++k) {
          const int64_t i = r == 0 ? k : n - 1 - k;
          reducer.Stage(i, in[r][i]);
          in[r][i].fill_(1e30);  // the reducer copied it: later changes must not reach the sum
        }
        absl::Status done = reducer.Finish(0.0f);
        EXPECT_EQ(reducer.published(), n) << r;
        return done;
      });
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
    EXPECT_EQ(order[r], (std::vector<int64_t>{3, 2, 1, 0})) << r;
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(sums[r][i].defined()) << r << " " << i;
      EXPECT_EQ(sums[r][i].scalar_type(), at::kFloat);
      EXPECT_TRUE(at::equal(sums[r][i], ref[i])) << "rank " << r << " matrix " << i;
    }
  }
}

// A rank that has no valid gradient for a matrix (Finish(NaN) fills what it did not stage):
// every rank's sum of that matrix is NaN, Publish stops both ranks at that same matrix, and
// nothing after it is reduced or handed on (caps of 16 bytes: a bucket per matrix).
TEST(CollectiveTest, OverlapReducerFillsWhatARankDidNotStageAndStopsEveryRankAlike) {
  if (!CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo (libgloo-dev)";
  const int world = 2;
  const std::vector<std::vector<int64_t>> shapes = {{4}, {4}, {4}};
  std::vector<std::vector<int64_t>> order(world);
  std::vector<int64_t> published(world, -1);
  std::vector<int64_t> bytes(world);
  const std::vector<absl::Status> st = OnReducerRanks(
      world, shapes, OverlapReducer::Buckets{16, 16},
      [&](int r, int64_t i, const at::Tensor& sum) {
        order[r].push_back(i);
        return static_cast<bool>(at::isfinite(sum).all().item<bool>());
      },
      [&](int r, Collective& c, OverlapReducer& reducer) {
        reducer.Stage(2, at::ones({4}));
        if (r == 0) reducer.Stage(1, at::ones({4}));  // rank 1 formed none for matrix 1
        reducer.Stage(0, at::ones({4}));
        absl::Status done = reducer.Finish(std::numeric_limits<float>::quiet_NaN());
        published[r] = reducer.published();
        bytes[r] = c.all_reduce_bytes();
        return done;
      });
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
    EXPECT_EQ(order[r], (std::vector<int64_t>{2, 1})) << r;
    EXPECT_EQ(published[r], 2) << r;
    EXPECT_EQ(bytes[r], 2 * 4 * 4) << r;  // matrix 0 was never all-reduced
  }
}

// One rank (no network): a staged shape that is not the matrix's, or an index out of range,
// is reported by Finish (the sum used the fill); a reducer dropped without Finish returns at
// once without reducing anything. DDP's default caps: the first bucket closes at 1 MiB, the
// next ones at 25 MiB.
TEST(CollectiveTest, OverlapReducerReportsABadStageAndCanBeAbandoned) {
  auto c = Collective::Join(CollectiveOptions{});
  ASSERT_TRUE(c.ok()) << c.status();
  {
    OverlapReducer mib(c->get(), std::vector<std::vector<int64_t>>(9, {512, 512}),
                       [](int64_t, const at::Tensor&) { return true; });
    EXPECT_EQ(mib.buckets(), (std::vector<std::vector<int64_t>>{{8}, {7, 6, 5, 4, 3, 2, 1, 0}}));
    OverlapReducer big(c->get(), std::vector<std::vector<int64_t>>(30, {1024, 1024}),
                       [](int64_t, const at::Tensor&) { return true; });
    // 4 MiB each: one, then 7 per bucket (28 MiB, the first count at or above 25), the rest.
    std::vector<size_t> sizes;
    for (const auto& b : big.buckets()) sizes.push_back(b.size());
    EXPECT_EQ(sizes, (std::vector<size_t>{1, 7, 7, 7, 7, 1}));
  }
  std::vector<at::Tensor> got(2);
  {
    OverlapReducer reducer(c->get(), {{2, 3}, {4}}, [&](int64_t i, const at::Tensor& sum) {
      got[i] = sum.clone();
      return true;
    });
    reducer.Stage(0, at::ones({3, 2}));
    reducer.Stage(5, at::ones({4}));
    reducer.Stage(1, at::full({4}, 2.0));
    const absl::Status st = reducer.Finish(-1.0f);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("matrix 0 staged with shape [3, 2]; expected [2, 3]"),
              std::string::npos)
        << st;
  }
  EXPECT_TRUE(at::equal(got[0], at::full({2, 3}, -1.0)));
  EXPECT_TRUE(at::equal(got[1], at::full({4}, 2.0)));
  const int64_t before = (*c)->all_reduce_bytes();
  const auto t0 = std::chrono::steady_clock::now();
  {
    OverlapReducer abandoned(c->get(), {{8}}, [](int64_t, const at::Tensor&) { return true; });
  }
  EXPECT_LT(Seconds(t0), 1.0);
  EXPECT_EQ((*c)->all_reduce_bytes(), before);
}

}  // namespace
}  // namespace lspo::offload
