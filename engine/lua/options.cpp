#include "lua/options.h"
