// The byte tokenizer: exact round trip for any bytes, specials only when asked.
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/rng.h"
#include "data/byte_tokenizer.h"

using namespace ctx;

TEST(DataTokenizer, RoundTripsRandomBytes) {
    ByteTokenizer tok;
    Rng rng(11);
    for (int trial = 0; trial < 20; ++trial) {
        std::string s(1 + rng.below(5000), '\0');
        for (char& c : s) c = static_cast<char>(rng.below(256));
        const auto t = tok.encode(s);
        ASSERT_EQ(t.size(), s.size());
        for (size_t i = 0; i < s.size(); ++i)
            ASSERT_EQ(t[i], static_cast<unsigned char>(s[i])) << "token i is byte i";
        ASSERT_EQ(tok.decode(t), s);
    }
    const std::string edge("\x00\x7f\x80\xff", 4);
    EXPECT_EQ(tok.encode(edge), (std::vector<int32_t>{0, 127, 128, 255}));
    EXPECT_EQ(tok.decode(tok.encode(edge)), edge);
    EXPECT_TRUE(tok.encode("").empty());
}

TEST(DataTokenizer, SpecialsOnlyWhenAskedAndDecodedAsDocumented) {
    ByteTokenizer tok;
    EXPECT_EQ(tok.vocab_size(), 259);
    EXPECT_EQ(ByteTokenizer::kBos, 256);
    EXPECT_EQ(ByteTokenizer::kEos, 257);
    EXPECT_EQ(ByteTokenizer::kPad, 258);
    EXPECT_EQ(tok.encode("hi", true, true), (std::vector<int32_t>{256, 'h', 'i', 257}));
    EXPECT_EQ(tok.encode("hi", false, true), (std::vector<int32_t>{'h', 'i', 257}));
    const std::vector<int32_t> t = {256, 'a', 258, 'b', 257};
    EXPECT_EQ(tok.decode(t), "ab");
    EXPECT_EQ(tok.decode(t, ByteTokenizer::Specials::Marker), "<|bos|>a<|pad|>b<|eos|>");
    EXPECT_TRUE(ByteTokenizer::is_special(257));
    EXPECT_FALSE(ByteTokenizer::is_special(255));
}

TEST(DataTokenizer, RejectsTokensOutsideTheVocabulary) {
    ByteTokenizer tok;
    for (int32_t bad : {259, -1}) {
        try {
            tok.decode(std::vector<int32_t>{'a', 'b', bad});
            FAIL() << "expected an error for " << bad;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(
                          "token " + std::to_string(bad) + " at index 2 is outside the vocabulary "
                          "[0, 259)"), std::string::npos) << e.what();
        }
    }
}
