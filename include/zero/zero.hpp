// Everything a training program needs: #include <zero/zero.hpp>.
#pragma once

#include "zero/config.hpp"
#include "zero/engine.hpp"
#include "zero/errors.hpp"
#include "zero/memory.hpp"
