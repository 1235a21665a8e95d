#include "file_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace dki {
namespace {

// Only the errnos open, flock, ftruncate, pwrite and close can give here. On Linux EAGAIN is
// EWOULDBLOCK and ENOTSUP is EOPNOTSUPP, so each has one name.
std::string errno_name(int e) {
  switch (e) {
    case EWOULDBLOCK: return "EWOULDBLOCK";
    case ENOLCK: return "ENOLCK";
    case EOPNOTSUPP: return "EOPNOTSUPP";
    case EINVAL: return "EINVAL";
    case EACCES: return "EACCES";
    case EPERM: return "EPERM";
    case ENOENT: return "ENOENT";
    case ENOTDIR: return "ENOTDIR";
    case EISDIR: return "EISDIR";
    case ELOOP: return "ELOOP";
    case ENAMETOOLONG: return "ENAMETOOLONG";
    case EROFS: return "EROFS";
    case EMFILE: return "EMFILE";
    case ENFILE: return "ENFILE";
    case ENOSPC: return "ENOSPC";
    case EDQUOT: return "EDQUOT";
    case EFBIG: return "EFBIG";
    case EIO: return "EIO";
    case EBADF: return "EBADF";
    default: return "";
  }
}

[[noreturn]] void fail(const std::string& path, const char* what, int e) {
  throw SystemError(path + ": " + what + " (" + std::strerror(e) + ")", errno_name(e));
}

}  // namespace

int lock_file(const std::string& path) {
  // O_CLOEXEC: a child process (child_process.spawn execs) would otherwise inherit the
  // descriptor and keep the lock after this process is gone.
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  // Another user's lock file (0644) opens read-only, and flock takes a read-only descriptor as
  // well; the file then keeps naming its last writer.
  const bool writable = fd >= 0 || errno != EACCES;
  if (!writable) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open", errno);
  int r;
  do r = ::flock(fd, LOCK_EX | LOCK_NB);
  while (r != 0 && errno == EINTR);
  if (r != 0) {
    const int e = errno;
    ::close(fd);
    fail(path, e == EWOULDBLOCK ? "locked by another open file" : "cannot lock", e);
  }
  // Only once the lock is ours: before it, the file is the holder's to write.
  const std::string pid = std::to_string(::getpid()) + "\n";
  errno = 0;
  if (writable && (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != ssize_t(pid.size()))) {
    const int e = errno != 0 ? errno : EIO;  // a short write sets none
    ::close(fd);
    fail(path, "cannot write this process's id", e);
  }
  return fd;
}

void unlock_file(int fd) {
  // On Linux the descriptor is closed even when close reports EINTR; retrying could close
  // another file that took its number meanwhile.
  if (::close(fd) != 0 && errno != EINTR) {
    const int e = errno;
    throw SystemError("unlockFile: cannot close descriptor " + std::to_string(fd) + " (" + std::strerror(e) + ")", errno_name(e));
  }
}

}  // namespace dki
