# Shared helpers: warnings, sanitizers, one static library per layer, tests with labels.

set(M3_WARNINGS -Wall -Wextra -Wno-unused-parameter)
if(M3_WERROR)
  list(APPEND M3_WARNINGS -Werror)
endif()

if(M3_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()

# m3_add_layer(NAME [DEPS dep...]): a static library m3_NAME from every .cpp in the calling folder
# (not recursive). Layers depend only on the layers named in DEPS; see docs/design/architecture.md.
function(m3_add_layer NAME)
  cmake_parse_arguments(ARG "" "" "DEPS;SOURCES" ${ARGN})
  if(ARG_SOURCES)
    set(srcs ${ARG_SOURCES})
  else()
    file(GLOB srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cpp)
  endif()
  if(srcs)
    add_library(m3_${NAME} STATIC ${srcs})
    target_include_directories(m3_${NAME} PUBLIC ${M3_REPO_ROOT}/src)
    target_compile_options(m3_${NAME} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${M3_WARNINGS}>)
    target_link_libraries(m3_${NAME} PUBLIC ${ARG_DEPS})
  else()
    add_library(m3_${NAME} INTERFACE)
    target_include_directories(m3_${NAME} INTERFACE ${M3_REPO_ROOT}/src)
    target_link_libraries(m3_${NAME} INTERFACE ${ARG_DEPS})
  endif()
endfunction()

find_package(GTest REQUIRED)
include(GoogleTest)

# Every test binary labelled unit: the sanitized CI build builds only these (scripts/test).
add_custom_target(m3_unit_tests)

# m3_add_test(NAME SOURCES src... DEPS dep... LABELS label...): one gtest binary; each TEST is a
# ctest case carrying the labels (unit, golden, e2e, ...).
function(m3_add_test NAME)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${NAME} ${ARG_SOURCES})
  target_link_libraries(${NAME} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  target_compile_options(${NAME} PRIVATE ${M3_WARNINGS})
  target_compile_definitions(${NAME} PRIVATE M3_REPO_ROOT="${M3_REPO_ROOT}")
  set_target_properties(${NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  if("unit" IN_LIST ARG_LABELS)
    add_dependencies(m3_unit_tests ${NAME})
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  gtest_discover_tests(${NAME} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
                       DISCOVERY_TIMEOUT 60)
endfunction()
