// An exclusive lock on a file that the kernel holds for as long as its descriptor is open, so it
// goes away with the process however that ends (a crash, SIGKILL): such a lock is never stale.
#pragma once
#include <string>

#include "common.h"

namespace dki {

// Opens `path` (created with mode 0644 if missing) and takes flock(LOCK_EX) on it without
// waiting, then replaces its contents with this process's id and a newline, for a refused
// newcomer to name the holder (unless the file is another user's, which is locked read-only).
// Returns the descriptor, which holds the lock until unlock_file. Throws SystemError with code
// "EWOULDBLOCK" when another open of the file holds the lock: flock locks belong to the open file
// description, so an earlier lock_file in this process counts.
int lock_file(const std::string& path);

// Closes a descriptor lock_file returned, which lets go of its lock. Only such a descriptor:
// closing one that Node or libuv owns would break them far from here. The binding keeps each
// thread's locks and passes nothing else.
void unlock_file(int fd);

}  // namespace dki
