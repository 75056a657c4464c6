#include "plugin/registry.h"
