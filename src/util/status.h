// Status and Result<T> are part of the public interface: include/trellis/status.h.
#pragma once

#include "trellis/status.h"
