# LibTorch from the `torch` Python wheel. find_package(Torch) drags in CUDA discovery and
# global flags; an imported target of our own keeps the build fast and explicit.
# -DZERO_TORCH_ROOT=DIR (a wheel's torch/ folder or an unpacked libtorch zip) skips Python.
set(ZERO_TORCH_ROOT "" CACHE PATH "LibTorch folder (with include/ and lib/); empty: from python3")
if(ZERO_TORCH_ROOT)
  set(TORCH_ROOT ${ZERO_TORCH_ROOT})
  set(TORCH_CUDA_VERSION "")
  if(EXISTS ${TORCH_ROOT}/lib/libtorch_cuda.so)
    set(TORCH_CUDA_VERSION "yes")
  endif()
  set(TORCH_CXX11_ABI 1)  # every wheel and libtorch zip since torch 2.7
else()
  find_package(Python3 REQUIRED COMPONENTS Interpreter)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c
      "import torch,os;print(os.path.dirname(torch.__file__));print(torch.version.cuda or '');print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
    OUTPUT_VARIABLE _torch_info OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _torch_rc)
  if(NOT _torch_rc EQUAL 0)
    message(FATAL_ERROR "zero: `python3 -c 'import torch'` failed. Install the wheel: pip install torch==2.13.0")
  endif()
  string(REPLACE "\n" ";" _torch_info "${_torch_info}")
  list(GET _torch_info 0 TORCH_ROOT)
  list(GET _torch_info 1 TORCH_CUDA_VERSION)
  list(GET _torch_info 2 TORCH_CXX11_ABI)
endif()
message(STATUS "zero: LibTorch at ${TORCH_ROOT} (CUDA: '${TORCH_CUDA_VERSION}')")

# ProcessGroupGloo.hpp includes <gloo/...>, which the wheel does not ship; Debian's libgloo-dev
# provides the headers. We only hold gloo objects through pointers, so no gloo library is linked:
# the symbols we call live in libtorch_cpu.
find_path(GLOO_INCLUDE_DIR gloo/context.h PATHS /usr/include /usr/local/include)
if(NOT GLOO_INCLUDE_DIR)
  message(FATAL_ERROR "zero: gloo headers not found. Install them: apt-get install libgloo-dev")
endif()

add_library(zero_torch INTERFACE)
target_include_directories(zero_torch SYSTEM INTERFACE
  ${TORCH_ROOT}/include ${TORCH_ROOT}/include/torch/csrc/api/include ${GLOO_INCLUDE_DIR})
target_link_directories(zero_torch INTERFACE ${TORCH_ROOT}/lib)
set(_torch_libs torch torch_cpu c10)
# The c10d backends' headers compile to nothing unless these are defined.
target_compile_definitions(zero_torch INTERFACE USE_C10D_GLOO _GLIBCXX_USE_CXX11_ABI=${TORCH_CXX11_ABI})
set(ZERO_WITH_CUDA OFF)
if(TORCH_CUDA_VERSION)
  set(ZERO_WITH_CUDA ON)
  find_package(CUDAToolkit REQUIRED)
  # ATen's CUDA headers include cuBLAS/cuSPARSE/NCCL headers, which a bare toolkit may lack; the
  # wheel's nvidia-* packages carry the very versions torch was built with, so they come first.
  file(GLOB _nvidia_includes ${TORCH_ROOT}/../nvidia/*/include)
  target_include_directories(zero_torch SYSTEM INTERFACE ${_nvidia_includes}
                             ${CUDAToolkit_INCLUDE_DIRS})
  list(APPEND _torch_libs torch_cuda c10_cuda)
  target_compile_definitions(zero_torch INTERFACE USE_C10D_NCCL USE_CUDA)
  target_link_libraries(zero_torch INTERFACE CUDA::cudart)
endif()
# libstdc++ goes first in the executables' NEEDED list: torch 2.11's libtorch.so exports its own
# copy of 64 std::filesystem functions, and whichever library comes first in lookup order wins
# them; torch's std::filesystem::remove_all crashes when called from our code (seen on 2.11).
target_link_libraries(zero_torch INTERFACE -Wl,--push-state,--no-as-needed stdc++
                      -Wl,--pop-state ${_torch_libs} Threads::Threads)
# Keep torch_cuda linked although nothing references it directly: its static initialisers
# register the CUDA backend with the dispatcher.
if(ZERO_WITH_CUDA)
  target_link_options(zero_torch INTERFACE "-Wl,--no-as-needed")
endif()
# Whatever links LibTorch finds it at run time, ours and a consumer's executables alike, without
# setting CMAKE_*_RPATH for a parent project.
target_link_options(zero_torch INTERFACE "LINKER:-rpath,${TORCH_ROOT}/lib")

