#!/usr/bin/env bash
# The RelWithDebInfo compile flags the build scripts pass to CMake: GCC's default (-O2 -g
# -DNDEBUG), or with ZERO_DEBUG_INFO=0 the same without -g. CI sets ZERO_DEBUG_INFO=0 (.ci/run):
# debug information changes no generated code (GCC keeps code generation independent of -g; its
# -fcompare-debug checks exactly that), so the tests run the same machine code, and it costs about
# a fifth of every compile (zero/engine/engine.cpp: 14.2 s of CPU with -g, 11.2 s without) and
# most of the linker's input. Always passed explicitly, so that a build directory configured
# once without -g gets it back when the variable is unset.
if [[ ${ZERO_DEBUG_INFO:-1} == 0 ]]; then
  echo "-O2 -DNDEBUG"
else
  echo "-O2 -g -DNDEBUG"
fi
