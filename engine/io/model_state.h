// Between the live objects (model, optimizer) and a TrainingState (core/training_state.h): host
// copies of the arenas by view name, and the checks that a state fits a model.
#pragma once

#include "io/checkpoint.h"
#include "model/decoder.h"
#include "model/optimizer.h"

namespace ctx {

// Fills state.tensors (parameters, and moments when opt is given), state.step and the configs.
void capture_model(const Model& model, const Optimizer* opt, TrainingState& state);

// Copies parameters (and moments into opt when given and present in the state) by name. Every
// model view must be in the state with the same shape and vice versa; throws naming the first
// mismatch. The optimizer's step is set from the state.
void restore_model(Model& model, Optimizer* opt, const TrainingState& state);

}  // namespace ctx
