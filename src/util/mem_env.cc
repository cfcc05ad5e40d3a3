#include "util/mem_env.h"

#include <algorithm>
#include <cstring>

namespace trellis {

class MemFile final : public File {
 public:
  MemFile(MemEnv* env, std::string path, std::shared_ptr<std::string> data, bool writable)
      : env_(env), path_(std::move(path)), data_(std::move(data)), writable_(writable) {}

  Status ReadAt(uint64_t off, void* buf, size_t n) override {
    std::lock_guard<std::mutex> lock(env_->mu_);
    if (off > data_->size() || n > data_->size() - off) return IoError("short read of '" + path_ + "'");
    std::memcpy(buf, data_->data() + off, n);
    return Status::Ok();
  }
  Status WriteAt(uint64_t off, const void* buf, size_t n) override {
    if (!writable_) return IoError("writing '" + path_ + "': opened for reading");
    std::lock_guard<std::mutex> lock(env_->mu_);
    if (off + n > data_->size()) data_->resize(off + n, '\0');
    std::memcpy(data_->data() + off, buf, n);
    return Status::Ok();
  }
  Status Sync() override { return Status::Ok(); }
  Status Truncate(uint64_t size) override {
    if (!writable_) return IoError("truncating '" + path_ + "': opened for reading");
    std::lock_guard<std::mutex> lock(env_->mu_);
    data_->resize(size, '\0');
    return Status::Ok();
  }
  Result<uint64_t> Size() override {
    std::lock_guard<std::mutex> lock(env_->mu_);
    return static_cast<uint64_t>(data_->size());
  }

 private:
  MemEnv* env_;
  std::string path_;
  std::shared_ptr<std::string> data_;
  bool writable_;
};

namespace {

std::string Parent(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

}  // namespace

Result<std::unique_ptr<File>> MemEnv::Open(const std::string& path, OpenMode mode) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = files_.find(path);
  if (mode == OpenMode::kRead) {
    if (it == files_.end()) return NotFound("cannot open '" + path + "': no such file");
    return std::unique_ptr<File>(new MemFile(this, path, it->second, false));
  }
  const std::string dir = Parent(path);
  if (!dir.empty() && !dirs_.count(dir)) return IoError("cannot create '" + path + "': no such directory");
  if (it == files_.end()) it = files_.emplace(path, std::make_shared<std::string>()).first;
  if (mode == OpenMode::kTruncate) it->second->clear();
  return std::unique_ptr<File>(new MemFile(this, path, it->second, true));
}

Status MemEnv::CreateDir(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  dirs_.insert(path);
  return Status::Ok();
}

Result<std::vector<std::string>> MemEnv::ListDir(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!dirs_.count(path)) return NotFound("cannot list '" + path + "': no such directory");
  std::vector<std::string> names;
  for (const auto& [p, data] : files_) {
    if (Parent(p) == path) names.push_back(p.substr(path.size() + 1));
  }
  return names;
}

Status MemEnv::Rename(const std::string& from, const std::string& to) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = files_.find(from);
  if (it == files_.end()) return NotFound("cannot rename '" + from + "': no such file");
  auto data = it->second;
  files_.erase(it);
  files_[to] = std::move(data);  // replaces `to`, as rename(2) does
  return Status::Ok();
}

Status MemEnv::Remove(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  files_.erase(path);  // absent is fine, as in the POSIX Env
  return Status::Ok();
}

Result<MappedFile> MemEnv::MapReadOnly(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = files_.find(path);
  if (it == files_.end()) return NotFound("cannot open '" + path + "': no such file");
  // A snapshot: later writes do not change what was mapped (a private map's pages are not
  // guaranteed to follow the file either; nothing here maps a file it writes).
  return MappedFile::FromMemory(path, std::make_shared<const std::string>(*it->second));
}

Result<std::string> MemEnv::Contents(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = files_.find(path);
  if (it == files_.end()) return NotFound("no file '" + path + "'");
  return *it->second;
}

}  // namespace trellis
