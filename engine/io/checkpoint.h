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

// Retention of the step files ctx.save_checkpoint writes (step-NNNNNNNN.h5) in a run directory:
// keep_last > 0 keeps the newest keep_last of them, every one whose step is a multiple of
// keep_every (when > 0) and always the file `latest` names, and deletes the others; keep_last 0
// keeps everything. Other files are never touched. A file that cannot be deleted is listed in
// `failed` with the reason (the caller warns); the directory not being listable throws.
struct CheckpointRetention {
    int64_t keep_last = 0;
    int64_t keep_every = 0;
};
struct RetentionResult {
    std::vector<std::string> deleted, failed;
};
RetentionResult apply_checkpoint_retention(const std::string& dir,
                                           const CheckpointRetention& policy);

}  // namespace ctx
