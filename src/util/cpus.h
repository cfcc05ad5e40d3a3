// How many threads a compute pool should run here: the physical cores this process may
// use, as llama.cpp defaults to, with the affinity mask (taskset, cpusets) and a cgroup
// CPU quota (containers, systemd CPUQuota) respected.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace trellis {

struct CpuBudget {
  int logical = 0;    // CPUs in the affinity mask
  int physical = 0;   // distinct cores among them (SMT siblings counted once)
  double quota = 0;   // the cgroup's CPU quota in CPUs (0: none)
  int threads = 1;    // the default: physical cores, at most the quota (rounded down), at least 1
  std::string Describe() const;  // e.g. "8 physical cores of 16 CPUs allowed, cgroup quota 6.0 CPUs"
};

// Reads the affinity mask, /sys/devices/system/cpu/cpuN/topology and the cgroup (v2
// cpu.max, or v1 cpu.cfs_quota_us / cpu.cfs_period_us). What it cannot read it does
// without: no topology counts every allowed CPU as a core.
CpuBudget ProbeCpus();

// The CPU's model name from /proc/cpuinfo (x86 "model name", with family and model
// numbers when the name is generic, e.g. in a VM; ARM "CPU part" codes), or "unknown".
std::string CpuModelName();

// --- the pieces, for tests ---
// Cores among CPUs given as (package id, core id) pairs; a CPU without topology (-1, -1)
// counts as a core of its own.
int CountPhysicalCores(const std::vector<std::pair<int, int>>& package_core);
// cgroup v2 cpu.max ("200000 100000" -> 2.0; "max 100000" -> nullopt), or v1's quota and
// period ("-1" -> nullopt). nullopt also for anything malformed.
std::optional<double> ParseCpuMax(std::string_view cpu_max);
std::optional<double> ParseCfsQuota(std::string_view quota_us, std::string_view period_us);
int ThreadsFor(int physical, double quota);

}  // namespace trellis
