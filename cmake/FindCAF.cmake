# Debian ships no CMake config for CAF 0.17: find headers and libraries by hand.
find_path(CAF_INCLUDE_DIR caf/all.hpp)
find_library(CAF_CORE_LIBRARY caf_core)
find_library(CAF_IO_LIBRARY caf_io)
if(CAF_INCLUDE_DIR)   # "#define CAF_VERSION 1706" -> 0.17.6
  file(STRINGS "${CAF_INCLUDE_DIR}/caf/config.hpp" _v REGEX "^#define CAF_VERSION [0-9]+")
  string(REGEX REPLACE ".* ([0-9]+)$" "\\1" _v "${_v}")
  math(EXPR _a "${_v} / 10000")
  math(EXPR _b "${_v} / 100 % 100")
  math(EXPR _c "${_v} % 100")
  set(CAF_VERSION "${_a}.${_b}.${_c}")
endif()
set(CAF_core_FOUND "${CAF_CORE_LIBRARY}")
set(CAF_io_FOUND "${CAF_IO_LIBRARY}")
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CAF REQUIRED_VARS CAF_INCLUDE_DIR CAF_CORE_LIBRARY
                                  VERSION_VAR CAF_VERSION HANDLE_COMPONENTS)
if(CAF_FOUND AND NOT TARGET CAF::core)
  find_package(Threads REQUIRED)
  add_library(CAF::core UNKNOWN IMPORTED)
  set_target_properties(CAF::core PROPERTIES IMPORTED_LOCATION "${CAF_CORE_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}" INTERFACE_LINK_LIBRARIES Threads::Threads)
  if(CAF_IO_LIBRARY)
    add_library(CAF::io UNKNOWN IMPORTED)
    set_target_properties(CAF::io PROPERTIES IMPORTED_LOCATION "${CAF_IO_LIBRARY}"
      INTERFACE_LINK_LIBRARIES CAF::core)
  endif()
endif()
