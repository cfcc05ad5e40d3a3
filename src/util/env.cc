#include "util/env.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace trellis {
namespace {

Status OsError(const std::string& what, const std::string& path) {
  return IoError(what + " " + path + ": " + std::strerror(errno));
}

class PosixFile final : public File {
 public:
  PosixFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PosixFile() override { close(fd_); }

  Status ReadAt(uint64_t off, void* buf, size_t n) override {
    auto* p = static_cast<uint8_t*>(buf);
    while (n > 0) {
      const ssize_t r = pread(fd_, p, n, static_cast<off_t>(off));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return OsError("reading", path_);
      if (r == 0) return IoError("reading " + path_ + ": short read");
      p += r;
      n -= static_cast<size_t>(r);
      off += static_cast<uint64_t>(r);
    }
    return Status::Ok();
  }
  Status WriteAt(uint64_t off, const void* buf, size_t n) override {
    const auto* p = static_cast<const uint8_t*>(buf);
    while (n > 0) {
      const ssize_t r = pwrite(fd_, p, n, static_cast<off_t>(off));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return OsError("writing", path_);
      p += r;
      n -= static_cast<size_t>(r);
      off += static_cast<uint64_t>(r);
    }
    return Status::Ok();
  }
  Status Sync() override { return fsync(fd_) == 0 ? Status::Ok() : OsError("syncing", path_); }
  Status Truncate(uint64_t size) override {
    return ftruncate(fd_, static_cast<off_t>(size)) == 0 ? Status::Ok() : OsError("truncating", path_);
  }
  Result<uint64_t> Size() override {
    struct stat st{};
    if (fstat(fd_, &st) != 0) return OsError("stat of", path_);
    return static_cast<uint64_t>(st.st_size);
  }

 private:
  int fd_;
  std::string path_;
};

class PosixEnv final : public Env {
 public:
  Result<std::unique_ptr<File>> Open(const std::string& path, OpenMode mode) override {
    int flags = O_CLOEXEC;
    switch (mode) {
      case OpenMode::kRead: flags |= O_RDONLY; break;
      case OpenMode::kReadWrite: flags |= O_RDWR | O_CREAT; break;
      case OpenMode::kTruncate: flags |= O_WRONLY | O_CREAT | O_TRUNC; break;
    }
    const int fd = open(path.c_str(), flags, 0644);
    if (fd < 0) {
      // Reading a file that is not there is NotFound; creating one where its directory is
      // missing is the OS's error like any other.
      if (mode == OpenMode::kRead) return errno == ENOENT ? NotFound(path + " does not exist") : OsError("opening", path);
      return OsError("cannot create", path);
    }
    return std::unique_ptr<File>(new PosixFile(fd, path));
  }
  Status CreateDir(const std::string& path) override {
    return mkdir(path.c_str(), 0755) == 0 || errno == EEXIST ? Status::Ok() : OsError("creating", path);
  }
  Result<std::vector<std::string>> ListDir(const std::string& path) override {
    DIR* d = opendir(path.c_str());
    if (!d) return OsError("listing", path);
    std::vector<std::string> names;
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    closedir(d);
    return names;
  }
  Status Rename(const std::string& from, const std::string& to) override {
    return rename(from.c_str(), to.c_str()) == 0 ? Status::Ok() : OsError("renaming " + from + " to", to);
  }
  Status Remove(const std::string& path) override {
    return unlink(path.c_str()) == 0 || errno == ENOENT ? Status::Ok() : OsError("removing", path);
  }
};

}  // namespace

Result<MappedFile> Env::MapReadOnly(const std::string& path) { return MappedFile::Open(path); }

int64_t Env::NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Env* Env::Default() {
  static PosixEnv* env = new PosixEnv();
  return env;
}

}  // namespace trellis
