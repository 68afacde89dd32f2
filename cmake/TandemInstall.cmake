# `cmake --install` and `cpack -G DEB`: tandem as a library others build against.
#   find_package(tandem 0.2 CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE tandem::tandem)
# The libraries are static archives (no SOVERSION to keep: a program carries the tandem it was
# built with); their dependencies (CAF, spdlog, fmt, OpenBLAS, ...) are Debian's shared ones,
# found again by tandemConfig.cmake.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The public API's headers: pipeline and connection (actors/pipeline.h), configuration,
# policies, fault hooks and errors, and the engine for those who embed it; with every tandem
# header they include, found by following their #include "..." lines, so a header added to
# one of them is installed with it. Private headers (actor internals, the server) stay out.
set(TANDEM_PUBLIC_HEADER_ROOTS
  actors/pipeline.h
  actors/error.h
  runtime/serving_config.h
  runtime/scheduler/policy.h
  runtime/fault_injection.h
  runtime/errors.h
  runtime/engine/engine.h
  runtime/engine/sampler.h)

function(tandem_header_closure out)
  set(todo ${ARGN})
  set(done "")
  while(todo)
    list(POP_FRONT todo h)
    if(h IN_LIST done OR NOT EXISTS "${PROJECT_SOURCE_DIR}/${h}")
      continue()
    endif()
    list(APPEND done "${h}")
    file(STRINGS "${PROJECT_SOURCE_DIR}/${h}" lines REGEX "^[ \t]*#[ \t]*include[ \t]+\"")
    foreach(line IN LISTS lines)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]+\"([^\"]+)\".*" "\\1" inc "${line}")
      list(APPEND todo "${inc}")
    endforeach()
  endwhile()
  list(SORT done)
  set(${out} "${done}" PARENT_SCOPE)
endfunction()

tandem_header_closure(TANDEM_PUBLIC_HEADERS ${TANDEM_PUBLIC_HEADER_ROOTS})
foreach(h IN LISTS TANDEM_PUBLIC_HEADERS)
  get_filename_component(dir "${h}" DIRECTORY)
  install(FILES "${PROJECT_SOURCE_DIR}/${h}" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/tandem/${dir}" COMPONENT dev)
endforeach()
install(FILES "${TANDEM_GENERATED_DIR}/tandem/version.h" "${PROJECT_SOURCE_DIR}/actors/tandem.h"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/tandem" COMPONENT dev)

# tandem::tandem: everything a program composing pipelines links.
add_library(tandem_library INTERFACE)
set_target_properties(tandem_library PROPERTIES EXPORT_NAME tandem)
target_link_libraries(tandem_library INTERFACE tandem_actors)
set(exported tandem_library tandem_actors tandem_transport tandem_runtime tandem_kernels tandem_warnings)
if(TANDEM_HAVE_CUDA)
  list(APPEND exported tandem_cuda)
endif()
install(TARGETS ${exported} EXPORT tandemTargets
        ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT dev
        INCLUDES DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}" "${CMAKE_INSTALL_INCLUDEDIR}/tandem")
install(TARGETS tandem RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}" COMPONENT bin)
if(TARGET tandem-bench)
  install(TARGETS tandem-bench RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}" COMPONENT bin)
endif()

set(cmake_dir "${CMAKE_INSTALL_LIBDIR}/cmake/tandem")
install(EXPORT tandemTargets NAMESPACE tandem:: DESTINATION "${cmake_dir}" COMPONENT dev)
configure_package_config_file(cmake/tandemConfig.cmake.in "${PROJECT_BINARY_DIR}/tandemConfig.cmake"
                              INSTALL_DESTINATION "${cmake_dir}")
# 0.x: a minor version may change the API, so 0.2 accepts 0.2.* only.
write_basic_package_version_file("${PROJECT_BINARY_DIR}/tandemConfigVersion.cmake" COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/tandemConfig.cmake" "${PROJECT_BINARY_DIR}/tandemConfigVersion.cmake"
              "${PROJECT_SOURCE_DIR}/cmake/FindCAF.cmake"
        DESTINATION "${cmake_dir}" COMPONENT dev)

# cpack -G DEB: one package with the binaries, the static libraries, the headers and the CMake
# package. Its dependencies are the Debian -dev packages a consumer's build needs (the
# archives are static, the libraries they call are shared).
set(CPACK_PACKAGE_NAME tandem)
set(CPACK_PACKAGE_VENDOR "tandem")
set(CPACK_PACKAGE_CONTACT "tandem developers <tandem@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "LLM serving with prefill and decode on separate worker pools (CAF actors)")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_DEPENDS
    "libcaf-dev (>= 0.17.6), libboost-dev (>= 1.74), libmsgpack-cxx-dev, nlohmann-json3-dev, libspdlog-dev, libfmt-dev, libxxhash-dev, libpcre2-dev, libopenblas-dev, libssl-dev, pkg-config")
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)  # the binaries' runtime libraries, from dpkg-shlibdeps
set(CPACK_STRIP_FILES ON)
include(CPack)

# The API reference of exactly the installed headers (docs/Doxyfile.in), built on demand:
#   cmake --build build --target api_reference   ->  build/docs/api/html/index.html
set(TANDEM_API_REFERENCE_INPUT "\"${PROJECT_SOURCE_DIR}/actors/tandem.h\" \"${TANDEM_GENERATED_DIR}/tandem/version.h\"")
foreach(h IN LISTS TANDEM_PUBLIC_HEADERS)
  string(APPEND TANDEM_API_REFERENCE_INPUT " \"${PROJECT_SOURCE_DIR}/${h}\"")
endforeach()
configure_file(docs/Doxyfile.in ${PROJECT_BINARY_DIR}/Doxyfile @ONLY)
find_program(DOXYGEN_PROGRAM doxygen)
if(DOXYGEN_PROGRAM)
  add_custom_target(api_reference COMMAND ${CMAKE_COMMAND} -E make_directory ${PROJECT_BINARY_DIR}/docs/api
                    COMMAND ${DOXYGEN_PROGRAM} ${PROJECT_BINARY_DIR}/Doxyfile
                    WORKING_DIRECTORY ${PROJECT_BINARY_DIR} COMMENT "API reference (Doxygen) of the public headers")
else()
  add_custom_target(api_reference COMMAND ${CMAKE_COMMAND} -E echo "doxygen is needed (tools/scripts/setup.sh --tests)"
                    COMMAND ${CMAKE_COMMAND} -E false)
endif()
