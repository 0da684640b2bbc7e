# cuda.cmake — the CUDA backend (cuda/*.cu, API in stats_cuda.h), included by kernels/CMakeLists.txt
# when the build has CUDA. Machine code for Hopper (sm_90a) and Ampere (sm_80), plus compute_80 PTX
# so that newer GPUs can JIT it. One object per kernel family and one for the launcher, compiled
# without -rdc (device code shared by several files is inline, in cuda/*.cuh); the objects go into
# attnstat_kernels (a C library: consumers link with the C compiler and the static CUDA runtime, no
# device link step) and into the shared library libattnstat_cuda.so that bench/bench_kernel.py
# loads with ctypes. kernels/dev/stats_dev is the harness that runs one variant against stats_cpu.
set(ATTNSTAT_CUDA_GENCODE
  "-gencode=arch=compute_90a,code=sm_90a"
  "-gencode=arch=compute_80,code=sm_80"
  "-gencode=arch=compute_80,code=compute_80"
  CACHE STRING "nvcc -gencode flags for the attnstat kernels")

add_library(attnstat_cuda_obj OBJECT
  cuda/launch.cu       # context, workspace, plan, run (stats_cuda.h)
  cuda/wgmma_sm90.cu   # variant 0
  cuda/wgf_sm90.cu     # variants 1-3 (2: float32 inputs)
  cuda/ws_sm90.cu      # variants 6-12 (6, 10, 11: the default by shape)
  cuda/ws_sm90_xs.cu   # the same with sink mass and distance (runs that ask for them)
  cuda/ws_sm90_mo.cu   # the same with the max logit alone (runs that ask for nothing else)
  cuda/mma_sm80.cu     # variant 4
  cuda/mma_sm80_xs.cu  # the same with sink mass and distance
  cuda/generic.cu)     # variant 5; fill_rows, packed_offsets, reduce_heads
target_include_directories(attnstat_cuda_obj PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(attnstat_cuda_obj PRIVATE attnstat_warnings attnstat_vocab)
# No exceptions on the host side: libattnstat links these objects for local mode, and the only
# C++ runtime they then need is the guard of nvcc's per-kernel handle statics (deploy/wheel.cmake
# links that statically into the wheel's library).
target_compile_options(attnstat_cuda_obj PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:${ATTNSTAT_CUDA_GENCODE} -Xptxas=-warn-spills -Xcompiler=-fno-exceptions>)
set_target_properties(attnstat_cuda_obj PROPERTIES POSITION_INDEPENDENT_CODE ON
  CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)

# Consumers are C programs: link them with the C compiler (nvcc as the linker would reject host
# flags such as -fsanitize=...). No device link is needed: nothing is built with -rdc.
set(CMAKE_CUDA_LINKER_PREFERENCE_PROPAGATES 0 PARENT_SCOPE)
set(CMAKE_CUDA_LINKER_PREFERENCE_PROPAGATES 0)
target_sources(attnstat_kernels PRIVATE $<TARGET_OBJECTS:attnstat_cuda_obj>)
target_compile_definitions(attnstat_kernels PUBLIC ATTNSTAT_HAVE_CUDA=1)
target_link_libraries(attnstat_kernels PUBLIC CUDA::cudart_static)

# The problem's checks (stats.c), position-independent, for libattnstat's local mode
# (client/local.c), which links them with attnstat_cuda_obj into the shared library.
add_library(attnstat_stats_pic OBJECT stats.c)
target_include_directories(attnstat_stats_pic PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(attnstat_stats_pic PRIVATE attnstat_warnings attnstat_vocab)
set_target_properties(attnstat_stats_pic PROPERTIES POSITION_INDEPENDENT_CODE ON)

# For the PyTorch comparison (bench/bench_kernel.py): built on request only.
add_library(attnstat_cuda SHARED EXCLUDE_FROM_ALL stats.c stats_cpu.c $<TARGET_OBJECTS:attnstat_cuda_obj>)
target_include_directories(attnstat_cuda PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(attnstat_cuda PRIVATE attnstat_warnings attnstat_vocab CUDA::cudart_static m)

# The dev harness: stats_dev VARIANT|all|list [B H N D] ... (kernels/dev/stats_dev.c). Built with the
# rest so that it always compiles; it needs a GPU to run (and says so without one).
add_executable(stats_dev dev/stats_dev.c)
target_link_libraries(stats_dev PRIVATE attnstat_kernels attnstat_warnings CUDA::cudart_static m)
