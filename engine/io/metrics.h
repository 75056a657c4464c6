// Observability sinks (DESIGN.md decision 10): one JSON line per training step and per evaluation
// record in <out_dir>/metrics.jsonl, and one CSV per evaluation task (<out_dir>/<task>.csv).
// Only rank 0 writes; other ranks hold an inactive writer.
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace ctx {

using Record = nlohmann::ordered_json;  // keys keep insertion order (CSV columns)

class MetricsWriter {
public:
    MetricsWriter() = default;  // inactive: writes nothing
    // Creates out_dir (and parents) when active. Appends to existing files, so a resumed run
    // continues the same metrics.jsonl.
    MetricsWriter(const std::string& out_dir, bool active);

    bool active() const { return active_; }
    const std::string& out_dir() const { return dir_; }
    // Appends record to metrics.jsonl (flushed: a crash loses at most the line being written).
    void jsonl(const Record& record);
    // Appends record's flat fields as a CSV row to <out_dir>/<table>.csv; the header is the first
    // record's keys. A later record with other keys is an error (the table would be unreadable).
    void csv(const std::string& table, const Record& record);

private:
    bool active_ = false;
    std::string dir_;
    std::ofstream jsonl_;
    struct Csv {
        std::ofstream out;
        std::vector<std::string> columns;
    };
    std::map<std::string, Csv> csvs_;
};

// CSV field escaping (RFC 4180): quote when needed, double the quotes.
std::string csv_escape(const std::string& field);

}  // namespace ctx
