#include "lua/runtime.h"
