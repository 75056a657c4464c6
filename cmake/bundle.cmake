# The self-contained GPU bundle (-DCTX_BUNDLE=ON; scripts/gpu_bundle.sh, docs/CUDA.md "The GPU
# bundle"). Included by the top-level CMakeLists.txt after the usual find_package() calls, before
# the engine; ctx_bundle_targets() runs after every target exists. Every dependency that is
# neither glibc nor CUDA becomes a static archive, or a shared library that `cmake --install`
# puts in <bundle>/lib, so the installed tree runs where only glibc and CUDA are installed.
#
#   Lua, PCRE2, utf8proc, HDF5 (+ szip/aec, zlib)  static archives of the Debian -dev packages
#   spdlog, fmt                                    header-only (Debian ships them shared only)
#   ctx_core, ctx_backend                          lib/*.so: one copy of the CUDA kernels
#                                                  (fatbinaries compressed for size) for all
#                                                  executables instead of one each
#   OpenBLAS                                       lib/libctx_openblas.so: the cblas_* and
#                                                  openblas_* part of libopenblas.a (26 MB, its
#                                                  kernels for every x86 CPU), linked once
#   libgomp, libstdc++, libgcc_s                   carried in lib/ (one C++ and one OpenMP
#                                                  runtime for the executables and the .so files)
#   GoogleTest                                     static already (libgtest.a)
#   Open MPI                                       none: CTX_MPI=OFF, a single-process world
#   CUDA runtime, cuBLAS, NCCL                     shared, from the GPU machine (bundle run.sh)
# Debian's Lua, HDF5 and zlib archives are not PIC, so they stay in the executables, which is why
# ctx_lua, ctx_plugin and ctxengine_core remain static.

if(CTX_MPI)
  message(FATAL_ERROR "CTX_BUNDLE=ON needs CTX_MPI=OFF: Open MPI cannot be carried in the bundle")
endif()
if(CTX_NATIVE)
  message(FATAL_ERROR "CTX_BUNDLE=ON needs CTX_NATIVE=OFF: the bundle runs on another machine's CPU")
endif()
if(CTX_BUILD_BENCHMARKS)
  message(FATAL_ERROR "CTX_BUNDLE=ON needs CTX_BUILD_BENCHMARKS=OFF: Debian ships Google "
    "Benchmark as a shared library only (the GPU benchmarks are `ctxengine bench`)")
endif()

# The device code of the CUDA objects in its smallest compressed form (a fifth of the default
# fatbinary on our kernels; the driver unpacks it once, when the module loads), so the bundle
# stays well inside what the device tool carries.
string(APPEND CMAKE_CUDA_FLAGS " --compress-mode=size")

# A static archive by file name, or a configure error that names the Debian package to install.
function(ctx_bundle_static_lib var file package)
  find_library(${var} NAMES ${file} HINTS ${ARGN} NO_CACHE)
  if(NOT ${var})
    message(FATAL_ERROR "CTX_BUNDLE: static library ${file} not found; install the Debian "
      "package ${package} (apt-get install ${package}; scripts/setup.sh lists it)")
  endif()
  set(${var} ${${var}} PARENT_SCOPE)
endfunction()

# A shared library of the compiler's runtime, to carry under its soname.
function(ctx_bundle_carry soname package)
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=${soname}
    OUTPUT_VARIABLE path OUTPUT_STRIP_TRAILING_WHITESPACE)
  get_filename_component(path "${path}" REALPATH)
  if(NOT IS_ABSOLUTE "${path}" OR NOT EXISTS "${path}" OR IS_DIRECTORY "${path}")
    message(FATAL_ERROR "CTX_BUNDLE: ${soname} not found (${path}); install ${package}")
  endif()
  install(FILES ${path} DESTINATION lib RENAME ${soname})
  message(STATUS "Bundle: carries ${path} as lib/${soname}")
endfunction()

ctx_bundle_static_lib(CTX_LUA_A liblua5.4-c++.a liblua5.4-dev)
ctx_bundle_static_lib(CTX_PCRE2_A libpcre2-8.a libpcre2-dev)
ctx_bundle_static_lib(CTX_UTF8PROC_A libutf8proc.a libutf8proc-dev)
ctx_bundle_static_lib(CTX_HDF5_A libhdf5_serial.a libhdf5-dev)
ctx_bundle_static_lib(CTX_SZ_A libsz.a libaec-dev)
ctx_bundle_static_lib(CTX_AEC_A libaec.a libaec-dev)
ctx_bundle_static_lib(CTX_Z_A libz.a zlib1g-dev)
# The OpenMP build of OpenBLAS, next to the shared one found above.
get_filename_component(ctx_ob_libdir ${OPENBLAS_LIBRARY} DIRECTORY)
ctx_bundle_static_lib(CTX_OPENBLAS_A libopenblas.a libopenblas-openmp-dev ${ctx_ob_libdir})

# Imported targets keep their include directories and definitions; only what they link changes.
set_target_properties(PkgConfig::LUA PROPERTIES INTERFACE_LINK_LIBRARIES "${CTX_LUA_A};${CMAKE_DL_LIBS};m")
set_target_properties(PkgConfig::PCRE2 PROPERTIES INTERFACE_LINK_LIBRARIES "${CTX_PCRE2_A}")
set_target_properties(PkgConfig::UTF8PROC PROPERTIES INTERFACE_LINK_LIBRARIES "${CTX_UTF8PROC_A}")
# Debian's HDF5 also links libcurl and libcrypto, for its S3 driver only: nothing the engine
# calls pulls those objects out of the archive.
set_target_properties(HDF5::HDF5 PROPERTIES INTERFACE_LINK_LIBRARIES
  "${CTX_HDF5_A};${CTX_SZ_A};${CTX_AEC_A};${CTX_Z_A};${CMAKE_DL_LIBS};m;pthread")

# spdlog and fmt compiled into the engine from their headers.
add_library(ctx_bundle_log INTERFACE)
target_compile_definitions(ctx_bundle_log INTERFACE SPDLOG_FMT_EXTERNAL FMT_HEADER_ONLY=1)
set(CTX_LOG_LIBRARIES ctx_bundle_log)

set(CTX_BACKEND_LIBRARY_TYPE SHARED)
# Only libcudart.so (the default adds cudart_static as well, a second runtime in the process).
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
# Executables live in <bundle>/bin and <bundle>/tests; libraries set their own (below).
set(CMAKE_INSTALL_RPATH "$ORIGIN/../lib")

# OpenBLAS: the cblas_* / openblas_* entry points of the archive (and the dynamic-arch kernels
# they reach) as one shared library, its other symbols hidden, but for the pair that re-runs the
# kernel choice (backend/cpu/cpu_blas.h).
execute_process(COMMAND nm --defined-only ${CTX_OPENBLAS_A}
  COMMAND grep -oE " T (cblas|openblas)_[A-Za-z0-9_]+$"
  OUTPUT_VARIABLE ctx_syms ERROR_QUIET)
string(REGEX MATCHALL "(cblas|openblas)_[A-Za-z0-9_]+" ctx_syms "${ctx_syms}")
list(APPEND ctx_syms gotoblas_dynamic_init gotoblas_dynamic_quit)
list(REMOVE_DUPLICATES ctx_syms)
list(LENGTH ctx_syms ctx_nsyms)
if(ctx_nsyms EQUAL 0)
  message(FATAL_ERROR "CTX_BUNDLE: no cblas_* symbols in ${CTX_OPENBLAS_A} (is nm installed?)")
endif()
list(TRANSFORM ctx_syms PREPEND "-Wl,--undefined=")
set(ctx_ob_dir ${CMAKE_BINARY_DIR}/ctx_openblas)
file(WRITE ${ctx_ob_dir}/exports.map "{ global: cblas_*; openblas_*; gotoblas_dynamic_init; gotoblas_dynamic_quit; local: *; };\n")
file(WRITE ${ctx_ob_dir}/empty.c "/* libctx_openblas.so: all its code comes from libopenblas.a */\n")
add_library(ctx_openblas SHARED ${ctx_ob_dir}/empty.c)
target_link_options(ctx_openblas PRIVATE ${ctx_syms} -Wl,--version-script=${ctx_ob_dir}/exports.map)
target_link_libraries(ctx_openblas PRIVATE ${CTX_OPENBLAS_A} OpenMP::OpenMP_C m)
set_target_properties(ctx_openblas PROPERTIES INSTALL_RPATH "$ORIGIN" LINK_DEPENDS ${CTX_OPENBLAS_A})
set(OPENBLAS_LIBRARY ctx_openblas)
install(TARGETS ctx_openblas LIBRARY DESTINATION lib)
message(STATUS "Bundle: OpenBLAS slice of ${ctx_nsyms} entry points from ${CTX_OPENBLAS_A}")

ctx_bundle_carry(libgomp.so.1 libgomp1)
ctx_bundle_carry(libstdc++.so.6 libstdc++6)
ctx_bundle_carry(libgcc_s.so.1 libgcc-s1)

# After every target exists (end of the top-level CMakeLists.txt): install rules, RUNPATHs and
# the `gpu_bundle` target that builds everything the bundle carries.
function(ctx_bundle_targets)
  get_property(tests GLOBAL PROPERTY CTX_GPU_TEST_TARGETS)
  get_property(plugins GLOBAL PROPERTY CTX_PLUGIN_TARGETS)
  install(TARGETS ctx_core ctx_backend LIBRARY DESTINATION lib)
  set_target_properties(ctx_core ctx_backend PROPERTIES INSTALL_RPATH "$ORIGIN")
  # lib/ctxengine/plugins/<kind>/x.so: the C++ plugins need lib/libstdc++.so.6.
  set_target_properties(${plugins} PROPERTIES INSTALL_RPATH "$ORIGIN/../../..")
  if(tests)
    install(TARGETS ${tests} RUNTIME DESTINATION tests)
  endif()
  add_custom_target(gpu_bundle)
  add_dependencies(gpu_bundle ctxengine ${tests})
endfunction()
