#include "data/corpus.h"

#include <cmath>
#include <cstring>
#include <new>

#include "core/error.h"
#include "core/rng.h"
#include "ctx/recall_spans.h"

namespace ctx {
namespace {

// splitmix64 finaliser: derives independent per-document seeds from (seed, index).
uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// "a" or "an" for the word that follows.
std::string article(const std::string& word) {
    return std::strchr("aeiou", word[0]) ? "an " : "a ";
}

template <size_t N>
const char* pick(Rng& rng, const char* const (&list)[N]) {
    return list[rng.below(N)];
}

// ---- word lists (ours). Fact phrases never contain '.', '?' or " is "; values never contain
// '.', ' ' or '?': find_recall_spans relies on it.
const char* const kPlaces[] = {
    "Harbor Station", "Cedar Hollow", "Fort Ember", "Quill Bay", "Ashford Mill", "Lantern Point",
    "Grey Moor", "Saltmarsh", "Windle Crossing", "Oak Ridge", "Briar Gate", "Copper Falls",
    "Ravenhill", "Juniper Wharf", "Stonebridge", "Mistral Keep", "Pike Lake", "Thistle Downs",
    "North Vale", "Amber Court", "Falcon Rock", "Hollow Pines", "Kestrel Field", "Marrow End",
    "Silver Sound", "Wren Harbour", "Dunmore", "Elm Terrace", "Frost Hill", "Glass Quay"};
const char* const kNames[] = {
    "Mira", "Tobin", "Selka", "Orrin", "Daria", "Fenwick", "Ilse", "Corin", "Yara", "Bastian",
    "Nell", "Rook", "Talia", "Ewan", "Petra", "Lucan", "Wynne", "Jory", "Maren", "Silas",
    "Odile", "Caspar", "Brin", "Alva", "Hollis", "Greer", "Tamsin", "Ivo", "Rhea", "Quentin"};
const char* const kSurnames[] = {
    "Ashdown", "Blackwood", "Carrow", "Dunleavy", "Everly", "Fairweather", "Gillan", "Hartwell",
    "Ingram", "Jessop", "Kettle", "Lorne", "Merriman", "Norcott", "Oakes", "Pryor", "Quarry",
    "Redfern", "Stroud", "Thorne"};
const char* const kColours[] = {"teal",   "crimson", "amber",  "violet", "ochre", "indigo",
                                "scarlet", "olive",  "silver", "maroon", "cobalt", "saffron",
                                "jade",   "coral",   "slate",  "ivory"};
const char* const kAnimals[] = {"heron", "badger", "mule", "falcon", "otter", "goat",
                                "raven", "hound",  "mare", "lynx",   "tortoise", "stag"};
const char* const kGuilds[] = {
    "Order of the Tide", "Clockmakers' Union", "Salt Traders", "Night Wardens",
    "Glassblowers' Circle", "Ferrymen's League", "Cartographers' Society", "Beekeepers' Lodge",
    "River Pilots", "Bellringers' Hall", "Archivists' Guild", "Copper Smiths", "Lantern Guild",
    "Weavers' Company"};
const char* const kSecretWords[] = {
    "juniper", "marlin", "thimble", "sparrow", "lantern", "quartz", "bramble", "cinder",
    "harrow", "velvet", "pepper", "saddle", "walnut", "gossamer", "tinder", "orchid", "pewter",
    "ember", "kettle", "larkspur"};
const char* const kObjects[] = {
    "ledger", "compass", "spare key", "old map", "brass lamp", "violin", "telescope", "seed box",
    "letters", "pocket watch", "music box", "silver spoon", "sea chest", "sketchbook", "lockbox",
    "spyglass"};

// ---- filler grammar
const char* const kAdj[] = {"quiet", "narrow", "old", "bright", "heavy", "cold", "small",
                            "broken", "patient", "crooked", "pale", "distant", "busy", "wet",
                            "gentle", "rusty", "tall", "dusty", "warm", "strange"};
const char* const kNoun[] = {"lamp", "cart", "door", "boat", "window", "bell", "rope", "barrel",
                             "ladder", "kettle", "wagon", "basket", "bridge", "candle", "gate",
                             "crate", "net", "stair", "wheel", "sail"};
const char* const kTVerb[] = {"carried", "painted", "mended", "watched", "opened", "pulled",
                              "cleaned", "counted", "followed", "lifted", "moved", "checked"};
const char* const kIVerb[] = {"rattled", "creaked", "waited", "drifted", "shone", "settled",
                              "swayed", "stopped", "glowed", "leaned"};
const char* const kAdv[] = {"slowly", "loudly", "quietly", "suddenly", "carefully", "twice",
                            "again", "badly", "softly", "early"};
const char* const kPrep[] = {"near", "behind", "under", "beside", "across", "past", "above"};
const char* const kPlaceNoun[] = {"harbour", "market", "mill", "chapel", "square", "station",
                                  "orchard", "quay", "tavern", "granary", "ferry", "workshop"};
const char* const kTime[] = {"morning", "evening", "night", "afternoon", "winter", "spring",
                             "early hours", "late autumn"};
const char* const kCount[] = {"two", "three", "four", "five", "six", "seven", "several",
                              "many", "a dozen"};
const char* const kMass[] = {"tar", "bread", "smoke", "salt", "rain", "pine", "oil", "apples"};

std::string filler_sentence(Rng& rng) {
    std::string s;
    switch (rng.below(10)) {
        case 0:
            s = std::string("The ") + pick(rng, kAdj) + " " + pick(rng, kNoun) + " " +
                pick(rng, kTVerb) + " the " + pick(rng, kNoun) + " " + pick(rng, kPrep) +
                " the " + pick(rng, kPlaceNoun) + ".";
            break;
        case 1:
        {
            const std::string adj = pick(rng, kAdj);
            s = std::string("In the ") + pick(rng, kTime) + ", " + pick(rng, kNames) + " " +
                pick(rng, kTVerb) + " " + article(adj) + adj + " " + pick(rng, kNoun) + ".";
        }
            break;
        case 2:
            s = std::string(pick(rng, kNames)) + " said that the " + pick(rng, kNoun) +
                " was " + pick(rng, kAdj) + " and " + pick(rng, kAdj) + ".";
            break;
        case 3:
            s = std::string("Nobody knew why the ") + pick(rng, kNoun) + " " + pick(rng, kIVerb) +
                " so " + pick(rng, kAdv) + ".";
            break;
        case 4:
            s = std::string(pick(rng, kAdj));
            s = (s[0] == 'o' ? "An " : "A ") + s + " " + pick(rng, kNoun) + " " +
                pick(rng, kIVerb) + " " + pick(rng, kPrep) + " the " + pick(rng, kPlaceNoun) +
                ", and " + pick(rng, kNames) + " " + pick(rng, kTVerb) + " it.";
            break;
        case 5:
            s = std::string("By the ") + pick(rng, kTime) + ", the " + pick(rng, kPlaceNoun) +
                " was " + pick(rng, kAdj) + " again.";
            break;
        case 6:
            s = std::string(pick(rng, kNames)) + " walked to the " + pick(rng, kPlaceNoun) +
                " and " + pick(rng, kTVerb) + " the " + pick(rng, kNoun) + " " +
                pick(rng, kAdv) + ".";
            break;
        case 7:
            s = std::string("There were ") + pick(rng, kCount) + " " + pick(rng, kNoun) +
                "s " + pick(rng, kPrep) + " the " + pick(rng, kPlaceNoun) + ".";
            break;
        case 8:
            s = std::string("The ") + pick(rng, kPlaceNoun) + " smelled of " + pick(rng, kMass) +
                " and " + pick(rng, kMass) + ".";
            break;
        default:
            s = std::string("When the ") + pick(rng, kNoun) + " " + pick(rng, kIVerb) +
                ", the " + pick(rng, kAdj) + " " + pick(rng, kNoun) + " " + pick(rng, kIVerb) +
                " " + pick(rng, kAdv) + ".";
            break;
    }
    return s;
}

std::string digits(Rng& rng, int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s.push_back(static_cast<char>('0' + rng.below(10)));
    return s;
}

struct Fact {
    std::string phrase, value;
    int64_t last_begin = 0, last_end = 0;  // latest mention of the value
    int64_t due_at = 0;                    // recall once the text reaches this offset
    int recalls = 0;
    bool stated = false;
};

// A fact with a random subject and a random value (7 templates).
Fact random_fact(Rng& rng) {
    Fact f;
    switch (rng.below(7)) {
        case 0:
            f.phrase = std::string("the vault code of ") + pick(rng, kPlaces);
            f.value = digits(rng, 5);
            break;
        case 1:
            f.phrase = std::string("Agent ") + pick(rng, kNames) + "'s favourite colour";
            f.value = pick(rng, kColours);
            break;
        case 2:
            f.phrase = std::string("the name of the ") + pick(rng, kAnimals) + " at " +
                       pick(rng, kPlaces);
            f.value = pick(rng, kNames);
            break;
        case 3:
            f.phrase = std::string("the platform for the train to ") + pick(rng, kPlaces);
            f.value = std::to_string(1 + rng.below(40));
            break;
        case 4:
            f.phrase = std::string("the secret word of the ") + pick(rng, kGuilds);
            f.value = pick(rng, kSecretWords);
            break;
        case 5:
            f.phrase = std::string("the birth year of ") + pick(rng, kNames) + " " +
                       pick(rng, kSurnames);
            f.value = std::to_string(1700 + rng.below(300));
            break;
        default:
            f.phrase = std::string("the room where ") + pick(rng, kNames) + " keeps the " +
                       pick(rng, kObjects);
            f.value = std::to_string(100 + rng.below(900));
            break;
    }
    return f;
}

class DocBuilder {
public:
    DocBuilder(const CorpusOptions& o, int64_t index)
        : o_(o), rng_(mix64(mix64(o.seed) ^ static_cast<uint64_t>(index))) {
        target_ = o.min_len + static_cast<int64_t>(rng_.below(
                                  static_cast<uint64_t>(o.max_len - o.min_len + 1)));
        doc_.text.reserve(static_cast<size_t>(target_));
        put(std::string("Log ") + std::to_string(index) + ": notes from " + pick(rng_, kPlaces) +
            "\n\nFacts for the record:\n");
        live_.resize(static_cast<size_t>(o.facts_per_doc));
        for (auto& f : live_) {
            f = new_fact();
            state(f, "", "\n");
        }
        put("\n");
    }

    CorpusDoc build() {
        while (!done_) {
            const int n_sent = 3 + static_cast<int>(rng_.below(5));
            for (int s = 0; s < n_sent && !done_; ++s) slot(s == 0 ? "" : " ");
            put("\n\n");
        }
        return std::move(doc_);
    }

private:
    int64_t size() const { return static_cast<int64_t>(doc_.text.size()); }

    // Appends `unit` if it fits in the target length and reports whether all of it went in.
    // A unit that does not fit ends the document: dropped if the text is already min_len long,
    // else cut at the target (so lengths stay within [min_len, max_len]).
    bool put(const std::string& unit) {
        if (done_) return false;
        if (size() + static_cast<int64_t>(unit.size()) <= target_) {
            doc_.text += unit;
            return true;
        }
        if (size() < o_.min_len) doc_.text.append(unit, 0, static_cast<size_t>(target_ - size()));
        done_ = true;
        return false;
    }

    int64_t draw_distance() {
        const double lo = std::log(static_cast<double>(o_.min_distance));
        const double hi = std::log(static_cast<double>(o_.max_distance));
        return static_cast<int64_t>(std::ceil(std::exp(rng_.uniform(lo, hi))));
    }

    // A fact whose phrase differs from every live one, so a recall names exactly one fact.
    Fact new_fact() {
        for (int tries = 0;; ++tries) {
            Fact f = random_fact(rng_);
            bool clash = false;
            for (const auto& g : live_) clash = clash || g.phrase == f.phrase;
            if (!clash || tries > 1000) return f;
        }
    }

    // "Note: <phrase> is <value>." States (or restates with a new value) a fact.
    void state(Fact& f, const char* sep, const char* end) {
        const std::string head = std::string(sep) + "Note: " + f.phrase + " is ";
        const int64_t begin = size() + static_cast<int64_t>(head.size());
        if (!put(head + f.value + "." + end)) return;
        f.stated = true;
        f.last_begin = begin;
        f.last_end = begin + static_cast<int64_t>(f.value.size());
        f.due_at = f.last_begin + draw_distance();
        ++doc_.n_facts;
    }

    void recall(Fact& f, const char* sep) {
        const bool question = rng_.uniform() < 0.4;
        const std::string head = question ? std::string(sep) + "Question: what is " + f.phrase +
                                                "? Answer: "
                                          : std::string(sep) + "Reminder: " + f.phrase + " is ";
        const int64_t begin = size() + static_cast<int64_t>(head.size());
        if (!put(head + f.value + ".")) return;
        RecallSpan r;
        r.value_begin = begin;
        r.value_end = begin + static_cast<int64_t>(f.value.size());
        r.source_begin = f.last_begin;
        r.source_end = f.last_end;
        r.question = question;
        doc_.recalls.push_back(r);
        // The recall is now the nearest copy of the value: the next gap counts from here.
        f.last_begin = r.value_begin;
        f.last_end = r.value_end;
        f.due_at = f.last_begin + draw_distance();
        if (++f.recalls >= o_.max_recalls_per_fact) f = new_fact();
    }

    // One sentence slot: a due recall first, else a pending statement, else filler.
    void slot(const char* sep) {
        // Due when the value would land at or after due_at: count the shorter (reminder)
        // prefix, so the realised distance is never below the drawn one.
        Fact* due = nullptr;
        for (auto& f : live_) {
            const int64_t value_at = size() + static_cast<int64_t>(std::strlen(sep) + 14 +
                                                                   f.phrase.size());
            if (f.stated && f.due_at <= value_at && (!due || f.due_at < due->due_at)) due = &f;
        }
        if (due) {
            if (rng_.uniform() < o_.recall_rate) {
                recall(*due, sep);
                return;
            }
            *due = new_fact();  // skipped: it retires unrecalled
        }
        for (auto& f : live_) {
            if (!f.stated) {
                state(f, sep, "");
                return;
            }
        }
        std::string unit(sep);  // (not sep + ...: GCC 12 warns falsely on that form)
        unit += filler_sentence(rng_);
        put(unit);
    }

    const CorpusOptions& o_;
    Rng rng_;
    int64_t target_ = 0;
    bool done_ = false;
    std::vector<Fact> live_;
    CorpusDoc doc_;
};

}  // namespace

void CorpusOptions::validate() const {
    CTX_CHECK(n_docs >= 0, "corpus: n_docs must be >= 0, got {}", n_docs);
    CTX_CHECK(min_len >= 1 && min_len <= max_len,
              "corpus: need 1 <= min_len <= max_len, got min_len {} and max_len {}", min_len,
              max_len);
    CTX_CHECK(facts_per_doc >= 0 && facts_per_doc <= 1000,
              "corpus: facts_per_doc must be in [0, 1000], got {}", facts_per_doc);
    CTX_CHECK(recall_rate >= 0.0 && recall_rate <= 1.0,
              "corpus: recall_rate must be in [0, 1], got {}", recall_rate);
    CTX_CHECK(max_recalls_per_fact >= 1, "corpus: max_recalls_per_fact must be >= 1, got {}",
              max_recalls_per_fact);
    CTX_CHECK(min_distance >= 1 && min_distance <= max_distance,
              "corpus: need 1 <= min_distance <= max_distance, got {} and {}", min_distance,
              max_distance);
}

CorpusDoc generate_document(const CorpusOptions& options, int64_t index) {
    options.validate();
    return DocBuilder(options, index).build();
}

std::vector<CorpusDoc> generate_corpus(const CorpusOptions& options) {
    options.validate();
    std::vector<CorpusDoc> docs;
    docs.reserve(static_cast<size_t>(options.n_docs));
    for (int64_t i = 0; i < options.n_docs; ++i) docs.push_back(DocBuilder(options, i).build());
    return docs;
}

std::vector<RecallSpan> find_recall_spans(std::string_view text) {
    // One parser for the generator's tests and the eval plugins: ctx/recall_spans.h.
    const auto len = static_cast<int64_t>(text.size());
    std::vector<ctx_recall_span> spans(64);
    int64_t n = ctx_find_recall_spans(text.data(), len, spans.data(), 64);
    if (n > 64) {
        spans.resize(static_cast<size_t>(n));
        n = ctx_find_recall_spans(text.data(), len, spans.data(), n);
    }
    if (n < 0) throw std::bad_alloc();
    std::vector<RecallSpan> out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
        const ctx_recall_span& s = spans[static_cast<size_t>(i)];
        out[static_cast<size_t>(i)] = {s.value_begin, s.value_end, s.source_begin, s.source_end,
                                       s.question != 0};
    }
    return out;
}

}  // namespace ctx
