// `ctxengine data ...`: the synthetic long-document corpus and token shards.
//   ctxengine data generate --out DIR [--docs N] [--min-len N] [--max-len N] [--seed N]
//                           [--val-fraction F] [--facts N] [--recall-rate F]
//                           [--min-distance N] [--max-distance N] [--le LIST]
//   ctxengine data info FILE.shard [--le LIST]
#pragma once

#include <string>
#include <vector>

namespace ctx {

// args are the words after "data". Returns the process exit code: 0 success, 2 usage error,
// 1 failure (the ctx::Error message is printed to stderr).
int run_data_command(const std::vector<std::string>& args);

}  // namespace ctx
