#include "bench/report.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <numeric>
#include <fstream>
#include <sstream>
#include <thread>

#include "kernels/cpu_features.h"

namespace trellis::bench {
namespace {

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  while (!s.empty() && s.front() == ' ') s.erase(0, 1);
  return s;
}

}  // namespace

std::string Capture(const std::string& cmd) {
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    pclose(p);
  }
  return out;
}

std::string RunHeader(const std::string& isa_note) {
  std::ostringstream m;
  const std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  m << "# date: " << date << "\n";
  const std::string commit = Trim(Capture("git -C '" TRELLIS_SOURCE_DIR "' rev-parse --short HEAD 2>/dev/null"));
  m << "# commit: " << (commit.empty() ? "unknown" : commit) << "\n";
  const std::string cpu = Trim(Capture("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-"));
  const std::string fam = Trim(Capture("grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2"));
  const std::string mod = Trim(Capture("grep -m1 '^model[[:space:]]*:' /proc/cpuinfo | cut -d: -f2"));
  m << "# cpu: " << cpu << " (cpu family " << fam << ", model " << mod << ")\n";
  m << "# isa: " << KernelIsaName(BestKernelIsa()) << (isa_note.empty() ? "" : " " + isa_note) << "\n";
  m << "# cores: " << std::thread::hardware_concurrency() << "\n";
  std::string cmd;
  std::ifstream argv("/proc/self/cmdline", std::ios::binary);
  for (std::string a; std::getline(argv, a, '\0');) cmd += (cmd.empty() ? "" : " ") + a;
  m << "# command: " << cmd << "\n";
  return m.str();
}

double Mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

double QuantileLinear(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

void Plot(const std::string& who, const std::string& out, const std::string& name, const std::string& title,
          const std::string& xlabel, const std::string& ylabel, const std::string& data,
          const std::vector<std::string>& series, bool logscale) {
  std::ofstream f(out + "/" + name + ".gp");
  f << "set terminal pngcairo size 900,560\nset output '" << out << "/" << name << ".png'\n";
  f << "set title '" << title << "'\nset xlabel '" << xlabel << "'\nset ylabel '" << ylabel << "'\nset grid\nset key left top\n";
  if (logscale) f << "set logscale y\n";
  f << "plot ";
  for (size_t i = 0; i < series.size(); ++i) {
    f << (i ? ", " : "") << "'" << data << "' index " << i << " using 1:2 with linespoints title '" << series[i] << "'";
  }
  f << "\n";
  f.close();
  const std::string cmd = "gnuplot '" + out + "/" + name + ".gp' 2>/dev/null";
  if (std::system(cmd.c_str()) != 0) {
    std::fprintf(stderr, "%s: gnuplot failed for %s (the .gp and data files are there)\n", who.c_str(), name.c_str());
  }
}

}  // namespace trellis::bench
