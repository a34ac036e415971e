// The mesh of parallel dimensions: the rank arithmetic against Megatron-LM's own algorithm
// (generate_masked_orthogonal_rank_groups, re-derived below) for every factorisation of small
// worlds, the layouts the next issues build on written out by hand, and the groups a mesh makes
// over real gloo ranks, checked by an all-reduce inside each.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/mesh.hpp"
#include "comm/mesh_layout.hpp"
#include "support/thread_group.hpp"

namespace zero::comm {
namespace {

using Groups = std::vector<std::vector<int>>;

// Megatron-LM's enumeration, derived from its docstring rather than from MeshLayout: sizes are
// listed innermost first (order "tp-dp-pp"); a group holds the ranks that differ only in the
// masked dimension, and groups are numbered by the other dimensions' coordinates, innermost
// fastest. rank = sum(coord[i] * prod(size[0..i))).
Groups megatron_groups(int world, const std::vector<int>& inner_first, int masked) {
  const int n = static_cast<int>(inner_first.size());
  std::vector<int> stride(n, 1);
  for (int i = 1; i < n; ++i) stride[i] = stride[i - 1] * inner_first[i - 1];
  const int group_size = inner_first[masked];
  Groups out;
  for (int g = 0; g < world / group_size; ++g) {
    // Decompose g over the unmasked dimensions, innermost first.
    int rest = g;
    int base = 0;
    for (int i = 0; i < n; ++i) {
      if (i == masked) continue;
      base += (rest % inner_first[i]) * stride[i];
      rest /= inner_first[i];
    }
    std::vector<int> ranks;
    for (int k = 0; k < group_size; ++k) ranks.push_back(base + k * stride[masked]);
    out.push_back(ranks);
  }
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(MeshLayout, EightRanksInMegatronOrder) {
  const MeshLayout m = MeshLayout::megatron(8, /*tp=*/2, /*pp=*/2);
  EXPECT_EQ(m.describe(), "pp 2 x dp 2 x tp 2");
  EXPECT_EQ(m.groups("tp"), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(m.groups("dp"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(m.groups("pp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  // Rank 5 = tp 1 + dp 0 * 2 + pp 1 * 4.
  EXPECT_EQ(m.coords(5), (std::vector<int>{1, 0, 1}));
  EXPECT_EQ(m.coord(5, "tp"), 1);
  EXPECT_EQ(m.coord(5, "dp"), 0);
  EXPECT_EQ(m.coord(5, "pp"), 1);
  EXPECT_EQ(m.group_of(5, "dp"), (std::vector<int>{5, 7}));
  EXPECT_EQ(m.group_of(6, "tp"), (std::vector<int>{6, 7}));
  EXPECT_EQ(m.group_of(6, "pp"), (std::vector<int>{2, 6}));
}

TEST(MeshLayout, FourRanksDataTimesTensor) {
  const MeshLayout m = MeshLayout::megatron(4, /*tp=*/2, /*pp=*/1);
  EXPECT_EQ(m.size("dp"), 2);
  EXPECT_EQ(m.groups("tp"), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(m.groups("dp"), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(m.groups("pp"), (Groups{{0}, {1}, {2}, {3}}));
  // Megatron's own example: tp 2, pp 4 on 16 ranks -> dp groups {0,2} {1,3} {4,6} ...
  const MeshLayout big = MeshLayout::megatron(16, 2, 4);
  EXPECT_EQ(big.groups("pp"),
            (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(big.groups("dp")[2], (std::vector<int>{4, 6}));
}

// Every factorisation tp x dp x pp of every world up to 36: the groups equal Megatron's, each
// dimension's groups partition the world, groups of two dimensions meet in at most one rank,
// and coordinates round-trip.
TEST(MeshLayout, EveryFactorisationMatchesMegatron) {
  int layouts = 0;
  for (int world = 1; world <= 36; ++world) {
    for (int tp = 1; tp <= world; ++tp) {
      for (int pp = 1; tp * pp <= world; ++pp) {
        if (world % (tp * pp) != 0) continue;
        const int dp = world / (tp * pp);
        const MeshLayout m = MeshLayout::megatron(world, tp, pp);
        ++layouts;
        const std::vector<int> inner_first{tp, dp, pp};
        const std::vector<std::string> names{"tp", "dp", "pp"};
        for (int d = 0; d < 3; ++d) {
          const Groups groups = m.groups(names[d]);
          ASSERT_EQ(groups, megatron_groups(world, inner_first, d))
              << m.describe() << " along " << names[d];
          std::vector<int> seen;
          for (const auto& g : groups) {
            ASSERT_EQ(static_cast<int>(g.size()), inner_first[d]);
            seen.insert(seen.end(), g.begin(), g.end());
            for (size_t i = 0; i < g.size(); ++i) {
              ASSERT_EQ(m.group_of(g[i], names[d]), g);
              ASSERT_EQ(m.coord(g[i], names[d]), static_cast<int>(i));
            }
          }
          std::sort(seen.begin(), seen.end());
          std::vector<int> all(world);
          std::iota(all.begin(), all.end(), 0);
          ASSERT_EQ(seen, all) << m.describe() << " along " << names[d];
        }
        for (int r = 0; r < world; ++r) {
          ASSERT_EQ(m.rank_of(m.coords(r)), r);
          const auto a = m.group_of(r, "tp"), b = m.group_of(r, "dp"), c = m.group_of(r, "pp");
          std::set<int> ab(a.begin(), a.end());
          int common = 0;
          for (int x : b) common += ab.count(x);
          ASSERT_EQ(common, 1) << "tp and dp groups of rank " << r << " in " << m.describe();
          std::set<int> bc(b.begin(), b.end());
          common = 0;
          for (int x : c) common += bc.count(x);
          ASSERT_EQ(common, 1);
        }
      }
    }
  }
  EXPECT_GT(layouts, 150);
}

TEST(MeshLayout, SizesThatDoNotDivideTheWorldNameTheNumbers) {
  const std::string e = error_of([] { MeshLayout::megatron(6, /*tp=*/4, /*pp=*/1); });
  EXPECT_NE(e.find("world size 6 is not divisible"), std::string::npos) << e;
  EXPECT_NE(e.find("tensor-parallel size 4"), std::string::npos) << e;
  const std::string p = error_of([] { MeshLayout::megatron(12, 2, 4); });
  EXPECT_NE(p.find("2 x pipeline-parallel size 4 = 8"), std::string::npos) << p;
  const std::string x = error_of([] { MeshLayout::megatron(8, 2, 2, /*dp=*/3); });
  EXPECT_NE(x.find("= 12 ranks, but the world size is 8"), std::string::npos) << x;
  const std::string u = error_of([] { MeshLayout::megatron(4, 2, 1).size("ep"); });
  EXPECT_NE(u.find("no dimension \"ep\" (it has pp, dp, tp)"), std::string::npos) << u;
  EXPECT_NE(error_of([] { MeshLayout(4, {{"a", 2}, {"a", 2}}); }).find("twice"), std::string::npos);
  EXPECT_NE(error_of([] { MeshLayout::megatron(4, 0, 1); }).find("tp 0"), std::string::npos);
}

// The groups a mesh hands out, over real gloo ranks: sizes, ranks and world ranks as written out
// above, and an all-reduce inside each gives the sum over exactly those ranks.
void check_mesh(int world, int tp, int pp,
                const std::vector<std::pair<std::string, Groups>>& want) {
  testing::run_ranks(world, [&](std::shared_ptr<Group> g) {
    Mesh mesh = Mesh::megatron(g, tp, pp);
    const int me = g->rank();
    for (const auto& [dim, groups] : want) {
      const auto& sub = mesh.group(dim);
      const auto mine = std::find_if(groups.begin(), groups.end(), [&](const auto& v) {
        return std::find(v.begin(), v.end(), me) != v.end();
      });
      ASSERT_NE(mine, groups.end());
      ASSERT_EQ(sub->size(), static_cast<int>(mine->size())) << dim;
      EXPECT_EQ(sub->name(), dim);
      EXPECT_EQ(sub->global_rank(sub->rank()), me);
      EXPECT_EQ(mesh.coord(dim), sub->rank());
      for (int i = 0; i < sub->size(); ++i) EXPECT_EQ(sub->global_rank(i), (*mine)[i]) << dim;
      at::Tensor t = at::full({3}, static_cast<float>(me + 1));
      sub->all_reduce_sum(t, "all_reduce in " + dim).wait();
      float sum = 0;
      for (int r : *mine) sum += static_cast<float>(r + 1);
      EXPECT_TRUE(t.equal(at::full({3}, sum))) << dim << " on rank " << me;
    }
  });
}

TEST(Mesh, EightGlooRanksTwoByTwoByTwo) {
  check_mesh(8, 2, 2,
             {{"tp", {{0, 1}, {2, 3}, {4, 5}, {6, 7}}},
              {"dp", {{0, 2}, {1, 3}, {4, 6}, {5, 7}}},
              {"pp", {{0, 4}, {1, 5}, {2, 6}, {3, 7}}}});
}

TEST(Mesh, FourGlooRanksDataTimesTensor) {
  check_mesh(4, 2, 1,
             {{"tp", {{0, 1}, {2, 3}}}, {"dp", {{0, 2}, {1, 3}}}, {"pp", {{0}, {1}, {2}, {3}}}});
}

TEST(Mesh, WorldSizeTheSizesDoNotDivideIsAClearError) {
  std::string e;
  testing::run_ranks(2, [&](std::shared_ptr<Group> g) {
    try {
      Mesh::megatron(g, /*tp=*/4, /*pp=*/1);
    } catch (const std::invalid_argument& x) {
      if (g->rank() == 0) e = x.what();
    }
  });
  EXPECT_NE(e.find("world size 2 is not divisible by tensor-parallel size 4"), std::string::npos)
      << e;
}

}  // namespace
}  // namespace zero::comm
