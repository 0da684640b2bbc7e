# wheel.cmake — the Python wheel that carries its own libattnstat (included by deploy/CMakeLists.txt).
#
#   cmake --build build --target python-wheel   ->  build/python/dist/attnstat-V-py3-none-PLATFORM.whl
#
# The library in the wheel is libattnstat built from the same objects as libattnstat.so, with
# protobuf-c linked in statically (its symbols hidden by the version script), so that it needs
# nothing but the C library: a venv or a container without Debian's libprotobuf-c1 can load it.
# With the CUDA build, the CUDA runtime is linked statically as it is in libattnstat.so (the
# driver is reached at run time). The wheel is built by Debian's python3-build with no build
# isolation (no package index needed) from a copy of client/python staged in the build tree, so
# the source tree is left untouched. Without python3-build the target says what to install.
find_library(ATTNSTAT_PROTOBUFC_STATIC NAMES libprotobuf-c.a HINTS ${PROTOBUFC_LIBRARY_DIRS}
             DOC "protobuf-c as a static library, linked into the wheel's libattnstat")

if(NOT ATTNSTAT_PROTOBUFC_STATIC)
  add_custom_target(python-wheel
    COMMAND ${CMAKE_COMMAND} -E echo "python-wheel: no libprotobuf-c.a found (Debian: libprotobuf-c-dev)"
    COMMAND ${CMAKE_COMMAND} -E false)
  return()
endif()

add_library(attnstat_wheel_lib SHARED EXCLUDE_FROM_ALL $<TARGET_OBJECTS:attnstat_client_objs>
            ${ATTNSTAT_LOCAL_OBJECTS})
set_target_properties(attnstat_wheel_lib PROPERTIES OUTPUT_NAME attnstat
  LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/python/lib
  SOVERSION ${PROJECT_VERSION_MAJOR}
  LINK_DEPENDS ${PROJECT_SOURCE_DIR}/client/libattnstat.map)
target_link_options(attnstat_wheel_lib PRIVATE
  -Wl,--version-script=${PROJECT_SOURCE_DIR}/client/libattnstat.map -Wl,--no-undefined
  -Wl,--exclude-libs,ALL)
# The archives by file, not by target: the targets would bring the shared libprotobuf-c along.
target_link_libraries(attnstat_wheel_lib PRIVATE
  $<TARGET_FILE:attnstat_proto> $<TARGET_FILE:attnstat_proto_gen> ${ATTNSTAT_PROTOBUFC_STATIC} m)
add_dependencies(attnstat_wheel_lib attnstat_proto attnstat_proto_gen)
if(ATTNSTAT_HAVE_CUDA)
  # The kernels of local mode need the C++ runtime's guarded statics: linked in, hidden.
  target_link_libraries(attnstat_wheel_lib PRIVATE CUDA::cudart_static)
  target_link_options(attnstat_wheel_lib PRIVATE -static-libstdc++ -static-libgcc)
endif()

set(wheel_stage ${PROJECT_BINARY_DIR}/python/src)
set(wheel_dist ${PROJECT_BINARY_DIR}/python/dist)
add_custom_target(python-wheel
  COMMAND ${CMAKE_COMMAND} -E rm -rf ${wheel_stage} ${wheel_dist}
  COMMAND ${CMAKE_COMMAND} -E copy_directory ${PROJECT_SOURCE_DIR}/client/python ${wheel_stage}
  COMMAND ${CMAKE_COMMAND} -E rm -rf ${wheel_stage}/build ${wheel_stage}/attnstat.egg-info
  COMMAND ${CMAKE_COMMAND} -E copy $<TARGET_FILE:attnstat_wheel_lib> ${wheel_stage}/attnstat/libattnstat.so
  COMMAND ${CMAKE_STRIP} --strip-unneeded ${wheel_stage}/attnstat/libattnstat.so
  COMMAND ${CMAKE_COMMAND} -E env ATTNSTAT_VERSION_HEADER=${PROJECT_SOURCE_DIR}/include/attnstat.h
          ATTNSTAT_VOCAB_HEADER=${PROJECT_SOURCE_DIR}/vocab/vocab.h
          PYTHONDONTWRITEBYTECODE=1
          ${ATTNSTAT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/build_wheel.py ${wheel_stage} ${wheel_dist}
  DEPENDS attnstat_wheel_lib
  COMMENT "Python wheel with libattnstat: ${wheel_dist}"
  VERBATIM)
