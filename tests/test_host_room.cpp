// The host-memory check of stage 3's page-locked error-feedback residuals (compress/host_room.hpp,
// review 2026-12-07c L3), on fake /proc and /sys files written here, not the machine's:
//  - the room is the smaller of MemAvailable and, for this process's cgroup and each one above
//    it, the limit less its working set (usage less inactive file pages), cgroup v2 and v1,
//    "max" and v1's huge "no limit" meaning none, a namespaced "/" path and a path the mount
//    does not have;
//  - the ranks on this node come from the launcher, Slurm's uneven per-node list included;
//  - the refusal's figures: per rank, what is allocated after it, the ranks, the node's total,
//    against the sums computed here.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "zero/compress/host_room.hpp"
#include "zero/compress/node_layout.hpp"
#include "zero/memory.hpp"

namespace zero::compress {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kGiB = int64_t{1} << 30;

class FakeHost {
 public:
  FakeHost()
      : dir_(fs::temp_directory_path() / ("zero_test_host_room_" + std::to_string(::getpid()))) {
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "sys");
    files.meminfo = (dir_ / "meminfo").string();
    files.self_cgroup = (dir_ / "cgroup").string();
    files.cgroup_root = (dir_ / "sys").string();
  }
  ~FakeHost() { fs::remove_all(dir_); }
  void write(const std::string& rel, const std::string& text) const {
    const fs::path p = dir_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  void meminfo(int64_t available) const {
    write("meminfo", "MemTotal:       263842304 kB\nMemFree:         1000 kB\nMemAvailable:   " +
                         std::to_string(available / 1024) + " kB\nBuffers:  12 kB\n");
  }
  // A cgroup directory under the mount: its limit file, usage and inactive file pages.
  void cgroup(const std::string& dir, const char* limit_file, const std::string& limit,
              const char* usage_file, int64_t usage, const char* inactive_key, int64_t inactive) {
    write("sys" + dir + "/" + limit_file, limit + "\n");
    write("sys" + dir + "/" + usage_file, std::to_string(usage) + "\n");
    write("sys" + dir + "/memory.stat", "anon 5\n" + std::string(inactive_key) + " " +
                                            std::to_string(inactive) + "\nactive_file 7\n");
  }
  void v2(const std::string& dir, const std::string& max, int64_t current, int64_t inactive) {
    cgroup(dir, "memory.max", max, "memory.current", current, "inactive_file", inactive);
  }
  void v1(const std::string& dir, const std::string& limit, int64_t usage, int64_t inactive) {
    cgroup("/memory" + dir, "memory.limit_in_bytes", limit, "memory.usage_in_bytes", usage,
           "total_inactive_file", inactive);
  }
  HostMemoryFiles files;

 private:
  fs::path dir_;
};

TEST(HostRoom, MemAvailableWithoutACgroup) {
  FakeHost h;
  h.meminfo(100 * kGiB);
  const HostMemory m = read_host_memory(h.files);
  EXPECT_EQ(m.available, 100 * kGiB);
  EXPECT_NE(m.source.find("MemAvailable"), std::string::npos) << m.source;
}

TEST(HostRoom, CgroupV2LimitAboveTheProcessBindsIt) {
  FakeHost h;
  h.meminfo(100 * kGiB);
  h.write("cgroup", "0::/job_7/step_0\n");
  // The step sets no limit; the job's 8 GiB holds 3 GiB, 1 GiB of it inactive file pages.
  h.v2("/job_7/step_0", "max", kGiB, 0);
  h.v2("/job_7", std::to_string(8 * kGiB), 3 * kGiB, kGiB);
  const HostMemory m = read_host_memory(h.files);
  EXPECT_EQ(m.available, 8 * kGiB - (3 * kGiB - kGiB));
  EXPECT_NE(m.source.find("job_7: memory.max " + format_bytes(8 * kGiB)), std::string::npos)
      << m.source;
  EXPECT_NE(m.source.find("MemAvailable"), std::string::npos) << "the machine's figure too";
  // A limit larger than the machine's room: MemAvailable is the smaller.
  h.v2("/job_7", std::to_string(500 * kGiB), 3 * kGiB, kGiB);
  EXPECT_EQ(read_host_memory(h.files).available, 100 * kGiB);
  // "max" everywhere: no limit.
  h.v2("/job_7", "max", 3 * kGiB, kGiB);
  EXPECT_EQ(read_host_memory(h.files).available, 100 * kGiB);
}

TEST(HostRoom, CgroupV2NamespaceRootAndUsageAboveTheLimit) {
  FakeHost h;
  h.meminfo(100 * kGiB);
  h.write("cgroup", "0::/\n");  // a container with its own cgroup namespace: the mount is its
  h.v2("", std::to_string(16 * kGiB), 4 * kGiB, 0);
  EXPECT_EQ(read_host_memory(h.files).available, 12 * kGiB);
  h.v2("", std::to_string(16 * kGiB), 17 * kGiB, 0);  // over its limit for a moment: no room
  EXPECT_EQ(read_host_memory(h.files).available, 0);
}

TEST(HostRoom, CgroupV1MemoryControllerWinsAndItsNoLimitIsNone) {
  FakeHost h;
  h.meminfo(100 * kGiB);
  h.write("cgroup", "12:pids:/slurm/job_9\n5:cpuacct,memory:/slurm/job_9\n0::/other\n");
  h.v1("/slurm/job_9", std::to_string(4 * kGiB), kGiB, kGiB / 2);
  h.v1("", "9223372036854771712", 50 * kGiB, 0);  // the root: PAGE_COUNTER_MAX pages
  h.v2("/other", std::to_string(kGiB), 0, 0);     // not the hierarchy memory is charged in
  const HostMemory m = read_host_memory(h.files);
  EXPECT_EQ(m.available, 4 * kGiB - kGiB / 2);
  EXPECT_NE(m.source.find("memory.limit_in_bytes"), std::string::npos) << m.source;
}

TEST(HostRoom, CgroupPathTheMountLacksFallsBackToTheMount) {
  FakeHost h;
  h.meminfo(100 * kGiB);
  // Docker on cgroup v1 without a namespace: /proc says the host's path, the mount is the
  // container's own cgroup.
  h.write("cgroup", "4:memory:/docker/abc123\n");
  h.v1("", std::to_string(6 * kGiB), 2 * kGiB, 0);
  EXPECT_EQ(read_host_memory(h.files).available, 4 * kGiB);
}

TEST(HostRoom, RanksOnThisNodeFromTheLauncher) {
  std::map<std::string, std::string> env;
  const auto get = [&env](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  EXPECT_EQ(ranks_on_this_node(get).count, 0) << "nothing said: the caller counts hosts";
  env["SLURM_TASKS_PER_NODE"] = "4(x2),2";
  EXPECT_EQ(ranks_on_this_node(get).count, 0) << "no SLURM_NODEID: which entry is unknown";
  const int want[] = {4, 4, 2, 0};
  for (int node = 0; node < 4; ++node) {
    env["SLURM_NODEID"] = std::to_string(node);
    const NodeRanks n = ranks_on_this_node(get);
    EXPECT_EQ(n.count, want[node]) << node;
    if (n.count > 0)
      EXPECT_EQ(n.source, "SLURM_TASKS_PER_NODE at SLURM_NODEID " + env["SLURM_NODEID"]);
  }
  env["SLURM_NODEID"] = "2";
  env["SLURM_STEP_TASKS_PER_NODE"] = "3(x3)";  // the step's own list wins over the job's
  EXPECT_EQ(ranks_on_this_node(get).count, 3);
  env["SLURM_STEP_TASKS_PER_NODE"] = "3(y3)";  // malformed: the job's list
  EXPECT_EQ(ranks_on_this_node(get).count, 2);
  env["SLURM_NTASKS_PER_NODE"] = "4(x2),2";  // not one number: the lists decide
  EXPECT_EQ(ranks_on_this_node(get).count, 2);
  env["LOCAL_WORLD_SIZE"] = "8";
  const NodeRanks n = ranks_on_this_node(get);
  EXPECT_EQ(n.count, 8);
  EXPECT_EQ(n.source, "LOCAL_WORLD_SIZE");
}

TEST(HostRoom, RefusalStatesEveryFigureItAddedUp) {
  HostRoom room;
  room.per_rank = 3 * kGiB + 12345;
  room.later = 5 * kGiB;
  room.later_what = "offload_optimizer: states";
  room.local_ranks = 4;
  room.local_from = "LOCAL_WORLD_SIZE";
  const int64_t node = (3 * kGiB + 12345 + 5 * kGiB) * 4;
  room.host = {node, "MemAvailable of /proc/meminfo"};
  EXPECT_EQ(host_room_error(room, "fp32", kGiB), "") << "exactly the room fits";
  room.host.available = node - 1;
  const std::string e = host_room_error(room, "fp32", kGiB);
  for (const std::string& part :
       {format_bytes(room.per_rank) + " per rank (" + std::to_string(room.per_rank) +
            " bytes) as fp32",
        format_bytes(5 * kGiB) + " of host memory after it (offload_optimizer: states)",
        "x 4 ranks on this node (LOCAL_WORLD_SIZE) = " + format_bytes(node),
        format_bytes(node - 1) + " available (MemAvailable of /proc/meminfo)",
        "error_feedback_dtype: int8 (" + format_bytes((kGiB + 5 * kGiB) * 4) + " on this node)",
        std::string("zero_quantized_gradients_error_feedback: false"), std::string("stage: 2")}) {
    EXPECT_NE(e.find(part), std::string::npos) << "missing '" << part << "' in: " << e;
  }
}

}  // namespace
}  // namespace zero::compress
