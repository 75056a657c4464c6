#include "io/metrics.h"

#include <fmt/ranges.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace ctx {

std::string csv_escape(const std::string& f) {
    if (f.find_first_of(",\"\n\r") == std::string::npos) return f;
    std::string out = "\"";
    for (char c : f) {
        if (c == '"') out += '"';
        out += c;
    }
    return out + "\"";
}

static std::string field_text(const Record& v) {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_number_float()) return fmt::format("{:.6g}", v.get<double>());
    return v.dump();
}

MetricsWriter::MetricsWriter(const std::string& out_dir, bool active)
    : active_(active), dir_(out_dir) {
    if (!active_) return;
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    CTX_CHECK(!ec, "cannot create the output directory '{}': {}", dir_, ec.message());
    const std::string path = dir_ + "/metrics.jsonl";
    jsonl_.open(path, std::ios::app);
    CTX_CHECK(jsonl_.good(), "cannot open '{}' for appending", path);
}

void MetricsWriter::jsonl(const Record& record) {
    if (!active_) return;
    errno = 0;
    jsonl_ << record.dump() << '\n';
    jsonl_.flush();
    CTX_CHECK(jsonl_.good(), "writing {}/metrics.jsonl failed ({}; disk full?)", dir_,
              errno ? std::strerror(errno) : "unknown error");
}

void MetricsWriter::csv(const std::string& table, const Record& record) {
    if (!active_) return;
    CTX_CHECK(record.is_object(), "internal: a CSV record must be a JSON object");
    auto it = csvs_.find(table);
    const std::string path = dir_ + "/" + table + ".csv";
    if (it == csvs_.end()) {
        Csv c;
        for (const auto& [k, v] : record.items()) c.columns.push_back(k);
        const bool exists = std::filesystem::exists(path);
        c.out.open(path, std::ios::app);
        CTX_CHECK(c.out.good(), "cannot open '{}' for appending", path);
        if (!exists) {
            for (size_t i = 0; i < c.columns.size(); ++i)
                c.out << (i ? "," : "") << csv_escape(c.columns[i]);
            c.out << '\n';
        }
        it = csvs_.emplace(table, std::move(c)).first;
    }
    Csv& c = it->second;
    std::vector<std::string> keys;
    for (const auto& [k, v] : record.items()) keys.push_back(k);
    CTX_CHECK(keys == c.columns, "{}: a record's fields ({}) differ from the table's columns ({})",
              path, fmt::join(keys, ","), fmt::join(c.columns, ","));
    size_t i = 0;
    errno = 0;
    for (const auto& [k, v] : record.items()) c.out << (i++ ? "," : "") << csv_escape(field_text(v));
    c.out << '\n';
    c.out.flush();
    CTX_CHECK(c.out.good(), "writing {} failed ({}; disk full?)", path,
              errno ? std::strerror(errno) : "unknown error");
}

}  // namespace ctx
