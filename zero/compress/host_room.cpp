#include "zero/compress/host_room.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

#include "zero/memory.hpp"

namespace zero::compress {
namespace {

thread_local int64_t t_test_available = 0;

// The number after `key` on the line of `path` that starts with it; nullopt when there is none.
std::optional<int64_t> keyed_value(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line, k;
  int64_t v = 0;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    if (ls >> k >> v && k == key) return v;
  }
  return std::nullopt;
}

// The one number a cgroup file holds; nullopt for "max", a missing file or anything else.
std::optional<int64_t> number_in(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  if (!(in >> s)) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (*end != '\0' || errno != 0 || v < 0) return std::nullopt;
  return static_cast<int64_t>(v);
}

struct CgroupFiles {
  const char* limit;
  const char* usage;
  const char* inactive;  // memory.stat's key for inactive file pages
};
constexpr CgroupFiles kV2{"memory.max", "memory.current", "inactive_file"};
constexpr CgroupFiles kV1{"memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"};
// v1 writes "no limit" as PAGE_COUNTER_MAX pages (about 2^63 bytes): a limit this large is none.
constexpr int64_t kNoLimit = int64_t{1} << 60;

struct Cgroup {
  std::string base, path;  // the hierarchy's mount, this process's cgroup in it ("/a/b")
  const CgroupFiles* files = nullptr;
};

// This process's memory cgroup, from /proc/self/cgroup: v1's memory controller where one is
// mounted (hybrid systems keep memory there), else the v2 unified hierarchy.
std::optional<Cgroup> find_cgroup(const HostMemoryFiles& f) {
  std::ifstream in(f.self_cgroup);
  std::string line;
  std::optional<Cgroup> v2;
  while (std::getline(in, line)) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (line.compare(0, a, "0") == 0 && controllers.empty()) {
      v2 = Cgroup{f.cgroup_root, path, &kV2};
      continue;
    }
    std::istringstream cs(controllers);
    for (std::string c; std::getline(cs, c, ',');) {
      if (c == "memory") return Cgroup{f.cgroup_root + "/memory", path, &kV1};
    }
  }
  return v2;
}

}  // namespace

HostMemory read_host_memory(const HostMemoryFiles& files) {
  HostMemory best;
  if (const auto kib = keyed_value(files.meminfo, "MemAvailable:")) {
    best = {*kib * 1024, "MemAvailable of " + files.meminfo};
  } else {
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    best = {pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0,
            "free physical pages (sysconf; no MemAvailable in " + files.meminfo + ")"};
  }
  const std::optional<Cgroup> cg = find_cgroup(files);
  if (!cg) return best;
  const std::string machine = best.source + ": " + format_bytes(best.available);
  // A limit above this process's cgroup binds it too (a Slurm job's, above its step's). Under a
  // cgroup namespace the path is "/" and the mount is this container's own cgroup; without one,
  // a path the mount does not have is skipped while walking up to the mount itself.
  std::string p = cg->path.empty() ? "/" : cg->path;
  for (;;) {
    const std::string dir = cg->base + (p == "/" ? "" : p);
    const std::optional<int64_t> limit = number_in(dir + "/" + cg->files->limit);
    if (limit && *limit < kNoLimit) {
      const int64_t usage = number_in(dir + "/" + cg->files->usage).value_or(0);
      const int64_t inactive = keyed_value(dir + "/memory.stat", cg->files->inactive).value_or(0);
      const int64_t used = std::max<int64_t>(0, usage - inactive);
      const int64_t room = std::max<int64_t>(0, *limit - used);
      if (room < best.available) {
        best = {room, "the limit of cgroup " + dir + ": " + cg->files->limit + " " +
                          format_bytes(*limit) + ", " + format_bytes(used) +
                          " of it in use; the machine's " + machine};
      }
    }
    if (p == "/") break;
    const size_t slash = p.find_last_of('/');
    p = slash == 0 || slash == std::string::npos ? "/" : p.substr(0, slash);
  }
  return best;
}

void set_host_available_for_testing(int64_t bytes) { t_test_available = bytes; }

HostMemory host_memory() {
  if (t_test_available > 0) return {t_test_available, "as the test set it"};
  return read_host_memory();
}

std::string host_room_error(const HostRoom& room, const std::string& store, int64_t int8_bytes) {
  if (room.fits()) return "";
  const std::string ranks =
      " x " + std::to_string(room.local_ranks) + " ranks on this node (" + room.local_from + ")";
  std::string s =
      "zero_optimization.zero_quantized_gradients_error_feedback at ZeRO stage 3 "
      "keeps each rank's residual of the whole gradient in page-locked host memory: " +
      format_bytes(room.per_rank) + " per rank (" + std::to_string(room.per_rank) + " bytes) as " +
      store + " (zero_quantized_gradients_error_feedback_dtype)";
  if (room.later > 0) {
    s += ", and each rank allocates " + format_bytes(room.later) + " of host memory after it (" +
         room.later_what + ")";
  }
  s += "," + ranks + " = " + format_bytes(room.node_bytes()) + ", but the node has " +
       format_bytes(room.host.available) + " available (" + room.host.source +
       "). Fix: set zero_optimization.zero_quantized_gradients_error_feedback_dtype: int8";
  if (store != "int8") {
    s += " (" + format_bytes((int8_bytes + room.later) * room.local_ranks) + " on this node)";
  }
  s += ", or zero_quantized_gradients_error_feedback: false (no residual; the quantization error "
       "is then not fed back), or zero_optimization.stage: 2 (the residual on the device "
       "instead), or fewer ranks per node";
  return s;
}

}  // namespace zero::compress
