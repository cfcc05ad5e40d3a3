#include "util/cpus.h"

#include <sched.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>

namespace trellis {

namespace {

std::string ReadSmall(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  if (f) std::getline(f, s);
  return s;
}

std::optional<long long> ParseInt(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
  if (s.empty() || s.size() > 19) return std::nullopt;
  size_t i = s[0] == '-' ? 1 : 0;
  if (i == s.size()) return std::nullopt;
  long long v = 0;
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return std::nullopt;
    v = v * 10 + (s[i] - '0');
  }
  return s[0] == '-' ? -v : v;
}

// The cgroup v2 path of this process ("0::/path" in /proc/self/cgroup), or "".
std::string CgroupV2Path() {
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("0::", 0) == 0) return line.substr(3);
  }
  return "";
}

}  // namespace

int CountPhysicalCores(const std::vector<std::pair<int, int>>& package_core) {
  std::set<std::pair<int, int>> cores;
  int unknown = 0;
  for (const auto& pc : package_core) {
    if (pc.first < 0 || pc.second < 0) {
      ++unknown;
    } else {
      cores.insert(pc);
    }
  }
  return static_cast<int>(cores.size()) + unknown;
}

std::optional<double> ParseCpuMax(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
  const size_t sp = s.find(' ');
  if (sp == std::string_view::npos) return std::nullopt;
  const std::string_view q = s.substr(0, sp), p = s.substr(sp + 1);
  if (q == "max") return std::nullopt;
  return ParseCfsQuota(q, p);
}

std::optional<double> ParseCfsQuota(std::string_view quota_us, std::string_view period_us) {
  const auto q = ParseInt(quota_us), p = ParseInt(period_us);
  if (!q || !p || *q <= 0 || *p <= 0) return std::nullopt;
  return static_cast<double>(*q) / static_cast<double>(*p);
}

int ThreadsFor(int physical, double quota) {
  int t = std::max(1, physical);
  // A quota of 2.5 CPUs runs 2 threads flat out; a third would be throttled mid-step.
  if (quota > 0) t = std::min(t, std::max(1, static_cast<int>(std::floor(quota + 1e-9))));
  return t;
}

CpuBudget ProbeCpus() {
  CpuBudget b;
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  if (cpus.empty()) {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (int c = 0; c < std::max(1L, n); ++c) cpus.push_back(c);
  }
  b.logical = static_cast<int>(cpus.size());
  std::vector<std::pair<int, int>> pc;
  for (int c : cpus) {
    const std::string dir = fmt::format("/sys/devices/system/cpu/cpu{}/topology/", c);
    const auto pkg = ParseInt(ReadSmall(dir + "physical_package_id"));
    const auto core = ParseInt(ReadSmall(dir + "core_id"));
    pc.emplace_back(pkg && core ? static_cast<int>(*pkg) : -1, pkg && core ? static_cast<int>(*core) : -1);
  }
  b.physical = CountPhysicalCores(pc);
  // The cgroup's quota: v2 at this process's cgroup (and its parents), else v1.
  std::optional<double> quota;
  std::string path = CgroupV2Path();
  if (!path.empty()) {
    for (;;) {
      const auto q = ParseCpuMax(ReadSmall("/sys/fs/cgroup" + (path == "/" ? std::string() : path) + "/cpu.max"));
      if (q && (!quota || *q < *quota)) quota = q;
      if (path == "/" || path.empty()) break;
      const size_t slash = path.rfind('/');
      path = slash == 0 ? "/" : path.substr(0, slash);
    }
  }
  if (!quota) {
    quota = ParseCfsQuota(ReadSmall("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), ReadSmall("/sys/fs/cgroup/cpu/cpu.cfs_period_us"));
  }
  b.quota = quota.value_or(0);
  b.threads = ThreadsFor(b.physical, b.quota);
  return b;
}

std::string CpuModelName() {
  std::ifstream f("/proc/cpuinfo");
  std::string line, name, family, model, part, impl;
  auto value = [](const std::string& l) {
    const size_t c = l.find(':');
    std::string v = c == std::string::npos ? "" : l.substr(c + 1);
    while (!v.empty() && v.front() == ' ') v.erase(v.begin());
    return v;
  };
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0 && name.empty()) name = value(line);
    else if (line.rfind("cpu family", 0) == 0 && family.empty()) family = value(line);
    else if (line.rfind("model", 0) == 0 && line.rfind("model name", 0) != 0 && model.empty()) model = value(line);
    else if (line.rfind("CPU part", 0) == 0 && part.empty()) part = value(line);
    else if (line.rfind("CPU implementer", 0) == 0 && impl.empty()) impl = value(line);
    if (line.empty() && (!name.empty() || !part.empty())) break;  // the first CPU is enough
  }
  if (!name.empty()) return family.empty() ? name : fmt::format("{} (cpu family {}, model {})", name, family, model);
  if (!part.empty()) return fmt::format("ARM implementer {} part {}", impl, part);
  return "unknown";
}

std::string CpuBudget::Describe() const {
  std::string s = fmt::format("{} physical core{} of {} CPU{} allowed", physical, physical == 1 ? "" : "s", logical,
                              logical == 1 ? "" : "s");
  if (quota > 0) s += fmt::format(", cgroup quota {:.1f} CPUs", quota);
  return s;
}

}  // namespace trellis
