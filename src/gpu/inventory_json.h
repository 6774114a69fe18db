// JSON form of the Inventory (`gpulet info --output json`). Field names are part of the CLI
// contract: scripts and `gpulet quota` read them back.
#pragma once

#include <nlohmann/json.hpp>

#include "gpu/inventory.h"

namespace gpulet::gpu {

nlohmann::json ToJson(const Inventory& inventory);

}  // namespace gpulet::gpu
