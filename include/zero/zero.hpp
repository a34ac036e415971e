// Everything a training program needs: #include <zero/zero.hpp>.
#pragma once

#include "zero/activation_checkpointing.hpp"
#include "zero/auto_strategy.hpp"
#include "zero/checkpoint_io.hpp"
#include "zero/command_line.hpp"
#include "zero/config.hpp"
#include "zero/device.hpp"
#include "zero/engine.hpp"
#include "zero/errors.hpp"
#include "zero/group.hpp"
#include "zero/launcher.hpp"
#include "zero/memory.hpp"
#include "zero/parallel_dims.hpp"
#include "zero/sharding.hpp"
