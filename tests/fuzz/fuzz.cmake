# libFuzzer targets (clang only: -fsanitize=fuzzer). Included from tests/CMakeLists.txt; uses only
# standard CMake variables and the dependencies the top level found. The project's own compiler
# may be g++, so each fuzzer is compiled by a custom command with clang++ (Debian package clang,
# which brings libFuzzer) from the engine sources it needs, when a trivial fuzzer builds with it;
# otherwise they are left out with a message. tests/fuzz/README.md lists what each covers.
#   safetensors_header_fuzz   io/safetensors.cpp's parser on arbitrary files
#   tokenizer_json_fuzz       tokenizer.json / vocab.json + merges.txt loading, then encode/decode
#   checkpoint_config_fuzz    model/optimizer config JSON as checkpoints store it
#   checkpoint_file_fuzz      load_checkpoint on HDF5 files with fuzzed attributes and datasets
#   shard_header_fuzz         the token shard reader on arbitrary files
#   hf_config_fuzz            HF config.json -> ModelConfig / PE options, and back
#   recipe_options_fuzz       recipe option tables checked against a schema
# ctest runs each briefly (fuzz.<name>) from its seed corpus in corpus/<name>; longer sessions:
# scripts/fuzz.sh [SECONDS_PER_TARGET] [BUILD_DIR].
find_program(CTX_CLANGXX NAMES clang++ clang++-16 clang++-15 clang++-14)
if(CTX_CLANGXX AND NOT DEFINED CTX_CLANG_FUZZER_WORKS)
  set(probe ${CMAKE_BINARY_DIR}/fuzz/probe)
  file(WRITE ${probe}.cpp "#include <cstddef>\n#include <cstdint>\n"
    "extern \"C\" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n")
  execute_process(COMMAND ${CTX_CLANGXX} -fsanitize=fuzzer,address ${probe}.cpp -o ${probe}
    RESULT_VARIABLE probe_rc OUTPUT_QUIET ERROR_QUIET)
  if(probe_rc EQUAL 0)
    set(CTX_CLANG_FUZZER_WORKS ON CACHE INTERNAL "clang++ builds libFuzzer targets")
  else()
    set(CTX_CLANG_FUZZER_WORKS OFF CACHE INTERNAL "clang++ builds libFuzzer targets")
  endif()
endif()

if(NOT CTX_CLANG_FUZZER_WORKS)
  message(STATUS "Fuzz targets: off (needs clang++ with libFuzzer: apt-get install clang)")
  return()
endif()
message(STATUS "Fuzz targets: ${CTX_CLANGXX}")

set(CTX_FUZZ_DIR ${CMAKE_BINARY_DIR}/fuzz)
set(CTX_FUZZ_SRC ${CMAKE_CURRENT_LIST_DIR})
# fmt and spdlog header-only, so a target links only the engine sources it names.
set(CTX_FUZZ_FLAGS -std=c++20 -O1 -g -fno-omit-frame-pointer
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
  -DFMT_HEADER_ONLY -DSPDLOG_FMT_EXTERNAL
  -I${PROJECT_SOURCE_DIR}/engine -I${PROJECT_SOURCE_DIR}/engine/include -I${CMAKE_BINARY_DIR}/engine)
file(GLOB CTX_FUZZ_HEADERS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/engine/*/*.h
  ${CTX_FUZZ_SRC}/*.h)

# ctx_fuzz_target(NAME SOURCES engine/relative.cpp ... [OBJECTS o ...] [FLAGS ...] [LIBS ...]
#                 [DICT file] [RUNS n] [MAX_LEN n]): builds <build>/fuzz/NAME_fuzz from NAME_fuzz.cpp and
# registers fuzz.NAME, a short run from corpus/NAME (new inputs go to a scratch corpus in the
# build tree; the seeds stay untouched).
function(ctx_fuzz_target name)
  cmake_parse_arguments(F "" "DICT;RUNS;MAX_LEN" "SOURCES;OBJECTS;FLAGS;LIBS" ${ARGN})
  set(exe ${CTX_FUZZ_DIR}/${name}_fuzz)
  set(srcs ${CTX_FUZZ_SRC}/${name}_fuzz.cpp)
  foreach(s ${F_SOURCES})
    list(APPEND srcs ${PROJECT_SOURCE_DIR}/engine/${s})
  endforeach()
  add_custom_command(OUTPUT ${exe}
    COMMAND ${CTX_CLANGXX} ${CTX_FUZZ_FLAGS} ${F_FLAGS} ${srcs} ${F_OBJECTS} ${F_LIBS} -o ${exe}
    DEPENDS ${srcs} ${F_OBJECTS} ${CTX_FUZZ_HEADERS}
    COMMENT "clang++ libFuzzer target ${name}_fuzz" VERBATIM)
  add_custom_target(${name}_fuzz ALL DEPENDS ${exe})

  set(options -runs=${F_RUNS} -max_len=${F_MAX_LEN} -timeout=10 -rss_limit_mb=2048)
  if(F_DICT)
    list(APPEND options -dict=${CTX_FUZZ_SRC}/${F_DICT})
  endif()
  file(MAKE_DIRECTORY ${CTX_FUZZ_DIR}/corpus/${name})
  add_test(NAME fuzz.${name}
    COMMAND ${CMAKE_COMMAND} -E env ASAN_OPTIONS=detect_leaks=1
      ${exe} ${options} -artifact_prefix=${CTX_FUZZ_DIR}/crash-${name}-
      ${CTX_FUZZ_DIR}/corpus/${name} ${CTX_FUZZ_SRC}/corpus/${name})
  set_tests_properties(fuzz.${name} PROPERTIES TIMEOUT 300)
endfunction()

ctx_fuzz_target(safetensors_header SOURCES io/safetensors.cpp
  DICT safetensors.dict RUNS 50000 MAX_LEN 2048)

ctx_fuzz_target(tokenizer_json
  SOURCES data/bpe_load.cpp data/bpe_tokenizer.cpp data/bpe_model.cpp data/bpe_normalize.cpp
    data/bpe_pretokenize.cpp data/bpe_added_tokens.cpp data/bpe_regex.cpp data/bpe_byte_map.cpp
    data/utf8.cpp
  LIBS ${PCRE2_LINK_LIBRARIES} ${UTF8PROC_LINK_LIBRARIES}
  DICT tokenizer.dict RUNS 5000 MAX_LEN 4096)

# model/config_json.cpp needs three small functions of model/optimizer.cpp (the schedule names,
# OptimizerConfig::validate), whose other functions call into the whole model layer. Rather than
# linking the rest of the engine, optimizer.cpp is compiled on its own and its symbols made weak
# (objcopy --weaken): what only those other functions use stays unresolved, at address 0. The
# fuzzers never call them; if one did, it would crash at once, a loud failure.
set(CTX_FUZZ_OPTIMIZER_OBJECT ${CTX_FUZZ_DIR}/optimizer_weak.o)
add_custom_command(OUTPUT ${CTX_FUZZ_OPTIMIZER_OBJECT}
  COMMAND ${CTX_CLANGXX} ${CTX_FUZZ_FLAGS} -c ${PROJECT_SOURCE_DIR}/engine/model/optimizer.cpp
    -o ${CTX_FUZZ_OPTIMIZER_OBJECT}
  COMMAND ${CMAKE_OBJCOPY} --weaken ${CTX_FUZZ_OPTIMIZER_OBJECT}
  DEPENDS ${PROJECT_SOURCE_DIR}/engine/model/optimizer.cpp ${CTX_FUZZ_HEADERS}
  COMMENT "clang++ model/optimizer.cpp for the fuzz targets (weak symbols)" VERBATIM)
set(CTX_FUZZ_OPTIMIZER_SOURCES model/config.cpp model/config_json.cpp)
ctx_fuzz_target(checkpoint_config SOURCES ${CTX_FUZZ_OPTIMIZER_SOURCES}
  OBJECTS ${CTX_FUZZ_OPTIMIZER_OBJECT}
  DICT config.dict RUNS 20000 MAX_LEN 1024)

list(TRANSFORM HDF5_C_INCLUDE_DIRS PREPEND -I OUTPUT_VARIABLE ctx_fuzz_hdf5_includes)
ctx_fuzz_target(checkpoint_file SOURCES io/checkpoint.cpp io/checkpoint_hdf5.cpp
  FLAGS ${ctx_fuzz_hdf5_includes} LIBS ${HDF5_C_LIBRARIES}
  RUNS 2000 MAX_LEN 1024)

ctx_fuzz_target(shard_header SOURCES data/shard.cpp
  RUNS 20000 MAX_LEN 1024)

ctx_fuzz_target(hf_config SOURCES io/hf_config.cpp ${CTX_FUZZ_OPTIMIZER_SOURCES}
  OBJECTS ${CTX_FUZZ_OPTIMIZER_OBJECT}
  DICT config.dict RUNS 20000 MAX_LEN 2048)

list(TRANSFORM LUA_INCLUDE_DIRS PREPEND -I OUTPUT_VARIABLE ctx_fuzz_lua_includes)
ctx_fuzz_target(recipe_options SOURCES lua/options.cpp core/options.cpp
  FLAGS ${ctx_fuzz_lua_includes} LIBS ${LUA_LINK_LIBRARIES}
  DICT options.dict RUNS 20000 MAX_LEN 1024)
