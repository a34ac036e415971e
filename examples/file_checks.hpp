// Checks on the trainer's input and output paths, made before any training time is spent, with
// messages that name the file and what it is for.
#pragma once

#include <cstdint>
#include <string>

namespace zero::examples {

// `path` must be a regular file (not a directory, FIFO or device) of at most `max_bytes`; returns
// its size. `what` says what the file is for ("the --config file", "trainer.data 'bin:x'").
uint64_t require_input_file(const std::string& path, const std::string& what, uint64_t max_bytes);

// The file can be created or appended to; an existing one is left as it is, a new one is not
// left behind. Throws std::runtime_error naming `what` and the path.
void require_writable_file(const std::string& path, const std::string& what);

// The directory exists (it is created if missing) and a file can be created in it.
void require_writable_dir(const std::string& dir, const std::string& what);

}  // namespace zero::examples
