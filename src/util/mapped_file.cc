#include "util/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace trellis {

Result<MappedFile> MappedFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT) return NotFound("cannot open '" + path + "': no such file");
    return IoError("cannot open '" + path + "': " + std::strerror(e));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return IoError("cannot stat '" + path + "': " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument("'" + path + "' is not a regular file");
  }
  MappedFile f;
  f.path_ = path;
  f.size_ = static_cast<size_t>(st.st_size);
  if (f.size_ > 0) {
    void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      return IoError("cannot mmap '" + path + "': " + std::strerror(e));
    }
    f.data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return f;
}

MappedFile MappedFile::FromMemory(std::string path, std::shared_ptr<const std::string> owner) {
  MappedFile f;
  f.path_ = std::move(path);
  f.size_ = owner->size();
  f.data_ = f.size_ > 0 ? reinterpret_cast<const uint8_t*>(owner->data()) : nullptr;
  f.owner_ = std::move(owner);
  return f;
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)),
      path_(std::move(o.path_)), owner_(std::move(o.owner_)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_ && !owner_) ::munmap(const_cast<uint8_t*>(data_), size_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    path_ = std::move(o.path_);
    owner_ = std::move(o.owner_);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_ && !owner_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace trellis
