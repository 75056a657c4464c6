// Word lists shared by the generated retrieval tasks (ours, written for ctxengine):
// adjective-noun keys (eval/longchat_lines' line indices, eval/ruler_niah's needle keys) and the
// words eval/ruler_niah uses as needle values. All lower case, no hyphens, all distinct; no value
// word occurs inside a key word or inside the tasks' fixed text (tests check it), so an output
// that merely repeats a key or the question never scores a value.
#pragma once

#include <cstdint>

namespace ctx_retrieval {

// 122 x 121 = 14762 distinct adjective-noun pairs.
inline constexpr const char* kAdjectives[] = {
    "amber",  "ancient", "angry",   "brave",    "breezy",   "bright",   "brisk",    "broken",
    "bumpy",  "calm",    "careful", "cheerful", "chilly",   "clever",   "cloudy",   "clumsy",
    "crisp",  "crooked", "curious", "damp",     "dazzling", "deep",     "dizzy",    "dusty",
    "eager",  "early",   "elegant", "empty",    "fancy",    "fearless", "fierce",   "fluffy",
    "foggy",  "fragile", "frozen",  "gentle",   "giant",    "gloomy",   "golden",   "grumpy",
    "hasty",  "heavy",   "hidden",  "hollow",   "humble",   "hungry",   "icy",      "jolly",
    "keen",   "lazy",    "little",  "lively",   "lonely",   "loud",     "lucky",    "marble",
    "mellow", "merry",   "mighty",  "misty",    "modest",   "muddy",    "narrow",   "nervous",
    "noble",  "noisy",   "odd",     "olive",    "orange",   "patient",  "plain",    "polite",
    "proud",  "purple",  "quick",   "quiet",    "rapid",    "rare",     "restless", "rough",
    "round",  "rusty",   "sandy",   "scarlet",  "secret",   "shiny",    "silent",   "silky",
    "silver", "simple",  "sleepy",  "slow",     "smoky",    "smooth",   "snowy",    "soft",
    "solid",  "sour",    "spicy",   "steady",   "sticky",   "stormy",   "strange",  "sturdy",
    "sunny",  "swift",   "tall",    "tame",     "tender",   "tidy",     "tiny",     "velvet",
    "violet", "vivid",   "warm",    "wary",     "wild",     "windy",    "witty",    "wooden",
    "young",  "zesty"};

inline constexpr const char* kNouns[] = {
    "acorn",    "anchor",  "apple",   "arrow",    "badger",   "balloon", "banjo",   "basket",
    "beacon",   "beetle",  "bicycle", "blanket",  "bottle",   "bridge",  "bucket",  "butter",
    "cabin",    "camel",   "candle",  "canyon",   "carpet",   "castle",  "cedar",   "cherry",
    "chimney",  "cliff",   "clock",   "cobbler",  "comet",    "compass", "cottage", "crayon",
    "cricket",  "dolphin", "donkey",  "dragon",   "drum",     "eagle",   "engine",  "falcon",
    "feather",  "fiddle",  "forest",  "fountain", "garden",   "glacier", "goblet",  "harbor",
    "hammer",   "helmet",  "island",  "jacket",   "kettle",   "ladder",  "lantern", "lemon",
    "lizard",   "magnet",  "meadow",  "mirror",   "mitten",   "monkey",  "needle",  "orchard",
    "otter",    "oyster",  "paddle",  "parrot",   "pebble",   "pencil",  "pepper",  "piano",
    "pillow",   "planet",  "pocket",  "pony",     "puddle",   "pumpkin", "puzzle",  "quilt",
    "rabbit",   "radish",  "raven",   "ribbon",   "river",    "rocket",  "saddle",  "sailor",
    "scarf",    "shovel",  "spider",  "spoon",    "squirrel", "statue",  "teapot",  "thimble",
    "thunder",  "tiger",   "tomato",  "tower",    "trumpet",  "tulip",   "turnip",  "turtle",
    "umbrella", "valley",  "violin",  "wagon",    "walnut",   "whistle", "window",  "wizard",
    "zebra",    "biscuit", "cactus",  "pirate",   "robot",    "sparrow", "walrus",  "muffin",
    "lobster"};

inline constexpr int64_t kNumAdj = sizeof kAdjectives / sizeof kAdjectives[0];
inline constexpr int64_t kNumNoun = sizeof kNouns / sizeof kNouns[0];

inline constexpr const char* kValueWords[] = {
    "saxophone", "marigold", "porcupine", "avalanche", "cinnamon", "gondola", "harpsichord",
    "labyrinth", "mandolin", "nectarine", "obsidian", "quartzite", "sapphire", "tambourine",
    "vermilion", "wolverine", "xylophone", "yodeler", "zeppelin", "accordion", "bagpipe",
    "caramel", "dandelion", "eucalyptus", "flamingo", "gazebo", "hibiscus", "iceberg", "jasmine",
    "kangaroo", "lavender", "mackerel", "nutmeg", "ostrich", "pelican", "quokka", "rhubarb",
    "salamander", "tarantula", "ukulele", "vanilla", "walkway", "asparagus", "blueberry",
    "chandelier", "dormouse", "eggplant", "firefly", "cardamom", "hedgehog", "igloo", "jellyfish",
    "kingfisher", "lighthouse", "meteorite", "narwhal", "octopus", "penguin", "tamarind",
    "reindeer", "scorpion", "toboggan", "persimmon", "volcano", "waterfall", "anthracite",
    "broccoli", "cucumber", "daffodil", "elephant", "galaxy", "hyacinth", "ironwood", "juniper",
    "koala", "bergamot", "magnolia", "nightingale", "orangutan", "paprika", "raspberry",
    "seahorse", "tapestry", "trombone", "vineyard", "windmill", "alpaca", "zucchini",
    "chinchilla", "dynamo", "emerald", "fjord", "granite", "hummingbird", "ivory", "jaguar",
    "kiwifruit", "limestone", "mongoose", "newt", "oregano", "pistachio",
};
inline constexpr int64_t kNumValueWords = sizeof kValueWords / sizeof kValueWords[0];

}  // namespace ctx_retrieval
