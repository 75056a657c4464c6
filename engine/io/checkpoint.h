// HDF5 checkpoints of the full training state (DESIGN.md decision 8). A resumed run continues
// bit-exactly. Files are written to a temporary name, flushed and renamed; the `latest` pointer
// of a run directory is updated last; checksums are verified on load.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/training_state.h"

namespace ctx {

inline constexpr const char* kCheckpointFormat = "ctxengine-checkpoint";
inline constexpr int kCheckpointVersion = 1;

// Writes `path` atomically: `<path>.tmp-<pid>` is written, flushed (H5Fflush + fsync), closed and
// renamed over `path`; a crash at any point leaves either the old file or the new one. Throws
// ctx::Error naming the path on any HDF5 or filesystem failure (and removes the temp file).
void save_checkpoint(const std::string& path, const TrainingState& state);

// Reads and verifies a checkpoint: the format attribute must be kCheckpointFormat and the version
// one this build reads; every dataset's checksum and the metadata checksum must match. Throws
// ctx::Error with the path and what is wrong (not an HDF5 file / truncated, wrong format, newer
// version, checksum mismatch in <dataset>, missing <dataset>) and never crashes on bad input.
TrainingState load_checkpoint(const std::string& path);

// Run directories: `<dir>/latest` is a small text file holding the file name of the newest
// complete checkpoint in dir; it is replaced atomically (temp + rename) after the checkpoint file
// itself is in place.
void set_latest_checkpoint(const std::string& dir, const std::string& file_name);
// Path of the newest checkpoint in dir, or "" if there is no `latest` pointer. Throws if the
// pointer names a file that does not exist.
std::string latest_checkpoint(const std::string& dir);

}  // namespace ctx
