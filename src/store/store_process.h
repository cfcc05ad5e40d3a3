// Tests only: `trellis store` as a real process, for tests that SIGKILL stores. Include
// from a test compiled with TRELLIS_BIN (the trellis binary's path) defined.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace trellis::store {

inline constexpr const char* kTrellisBin = TRELLIS_BIN;

// A `trellis store` process on loopback: its port is read from its start-up line.
struct StoreProcess {
  pid_t pid = -1;
  uint16_t port = 0;
  explicit StoreProcess(const std::string& mem, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {kTrellisBin, "store", "--listen", "127.0.0.1:0", "--mem", mem, "--net-devices", "lo"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int fds[2];
    EXPECT_EQ(pipe(fds), 0);
    pid = fork();
    if (pid == 0) {
      dup2(fds[1], 2);
      close(fds[0]);
      execv(kTrellisBin, argv.data());
      _exit(127);
    }
    close(fds[1]);
    err = fdopen(fds[0], "r");
    char line[512];
    while (err && std::fgets(line, sizeof line, err)) {
      if (const char* at = std::strstr(line, "listening on 127.0.0.1:")) {
        port = static_cast<uint16_t>(std::atoi(at + std::strlen("listening on 127.0.0.1:")));
        break;
      }
    }
  }
  std::string Addr() const { return "127.0.0.1:" + std::to_string(port); }
  // SIGTERM: a clean stop, exit code 0, metrics printed.
  int Stop(std::string* log) {
    kill(pid, SIGTERM);
    char line[512];
    while (err && std::fgets(line, sizeof line, err)) *log += line;
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  void Kill() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      pid = -1;
    }
  }
  ~StoreProcess() {
    Kill();
    if (err) std::fclose(err);
  }
  FILE* err = nullptr;
};

}  // namespace trellis::store
