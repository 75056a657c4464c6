# HF transformers reference tests (docs/HF.md). Included from tests/CMakeLists.txt; uses only
# standard CMake variables. Each case builds a tiny random model with transformers
# (make_reference.py), compares ctxengine's logits, loss and gradients with it (hf_check),
# converts HF -> HDF5 -> HF and reloads every export in transformers (check_export.py).
# Without torch + transformers (scripts/setup_python.sh) they print SKIPPED and exit 77.
add_executable(hf_check ${CMAKE_CURRENT_LIST_DIR}/hf_check.cpp)
target_link_libraries(hf_check PRIVATE ctxengine_core)
target_compile_definitions(hf_check PRIVATE CTX_HF_PLUGIN_DIR="${CMAKE_BINARY_DIR}/plugins")
add_dependencies(hf_check ctxengine)  # the cases run `ctxengine convert`; it builds the plugins

foreach(case gpt2 gpt2_relu neox_parallel neox_sequential_linear neox_dynamic neox_yarn neox_llama3
             neox_longrope bloom llama mistral qwen2)
  add_test(NAME hf_reference.${case}
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/run_case.sh ${case} $<TARGET_FILE:hf_check>
      ${CMAKE_BINARY_DIR}/ctxengine ${PROJECT_SOURCE_DIR} ${CMAKE_BINARY_DIR})
  set_tests_properties(hf_reference.${case} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
endforeach()

# The HF recipes in quick mode on tiny models saved by transformers, with corpora tokenized by
# each model's tokenizer.json (ctxengine tokenize --tokenizer HF_DIR).
foreach(family gpt2 pythia bloom llama)
  add_test(NAME recipe.hf_${family}_chunk_025_quick
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/recipe_quick.sh ${family} ${CMAKE_BINARY_DIR}/ctxengine
      ${PROJECT_SOURCE_DIR} ${CMAKE_BINARY_DIR})
  set_tests_properties(recipe.hf_${family}_chunk_025_quick PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
endforeach()

# ctx.load_hf / ctx.save_hf and `ctxengine convert` HF -> HDF5 -> HF on a Python-free fixture.
add_test(NAME cli.hf_lua_api_and_convert
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/cli/expect.sh 0 "round trip bit-exact" --
    bash ${CMAKE_CURRENT_LIST_DIR}/lua_api.sh ${CMAKE_BINARY_DIR}/ctxengine
      ${CMAKE_BINARY_DIR}/cli_tmp/hf_lua_api)
set_tests_properties(cli.hf_lua_api_and_convert PROPERTIES TIMEOUT 120)

# `ctxengine convert` errors: usage, missing directory, unknown architecture, mismatched tensors.
set(CTX_HF_FIXTURES ${CMAKE_CURRENT_LIST_DIR}/fixtures)
set(CTX_HF_EXPECT ${PROJECT_SOURCE_DIR}/tests/cli/expect.sh)
function(ctx_hf_cli_test name code regex)
  add_test(NAME cli.${name} COMMAND bash ${CTX_HF_EXPECT} ${code} ${regex} ${ARGN})
  set_tests_properties(cli.${name} PROPERTIES TIMEOUT 120)
endfunction()
ctx_hf_cli_test(convert_usage 2 "usage: ctxengine convert HF_DIR OUT.h5"
  -- ${CMAKE_BINARY_DIR}/ctxengine convert)
ctx_hf_cli_test(convert_missing_dir 1 "nosuch_model: not a directory"
  -- ${CMAKE_BINARY_DIR}/ctxengine convert ${CTX_HF_FIXTURES}/nosuch_model ${CMAKE_BINARY_DIR}/cli_tmp/x.h5)
ctx_hf_cli_test(convert_unknown_arch 1 "model_type \"mamba\" is not supported \\(supported: gpt2, gpt_neox, bloom, llama, mistral, qwen2\\)"
  -- ${CMAKE_BINARY_DIR}/ctxengine convert ${CTX_HF_FIXTURES}/mamba ${CMAKE_BINARY_DIR}/cli_tmp/x.h5)
ctx_hf_cli_test(convert_missing_tensor 1 "missing \\(1\\): transformer\\.h\\.1\\.ln_2\\.bias$"
  -- ${CMAKE_BINARY_DIR}/ctxengine convert ${CTX_HF_FIXTURES}/gpt2_renamed ${CMAKE_BINARY_DIR}/cli_tmp/x.h5)
ctx_hf_cli_test(convert_unexpected_tensor 1 "unexpected \\(1\\): transformer\\.h\\.1\\.ln_2\\.beta$"
  -- ${CMAKE_BINARY_DIR}/ctxengine convert ${CTX_HF_FIXTURES}/gpt2_renamed ${CMAKE_BINARY_DIR}/cli_tmp/x.h5)
