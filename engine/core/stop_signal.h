// Stop requests by signal (issue "runs that survive"): a cluster's preemption (Slurm's SIGTERM,
// or a chosen signal ahead of the time limit) sets a flag that the training loop reads at the
// end of every step. Every rank learns of a request from any rank through the step's loss
// all-reduce, so all of them stop after the same step, save collectively and exit with
// kExitStopped (docs/ARCHITECTURE.md "Reliability").
#pragma once

#include <string>
#include <vector>

namespace ctx {

// The process exit status of a run stopped by a signal after saving (EX_TEMPFAIL: "try again").
inline constexpr int kExitStopped = 75;

// Installs the handler for these signals (SIGTERM, SIGUSR1, ...); a later call replaces the set.
void install_stop_signals(const std::vector<int>& signals);
// "TERM,USR1" -> {SIGTERM, SIGUSR1}; "none" -> {}. ctx::Error naming the unknown name.
std::vector<int> stop_signals_from_names(const std::string& names);
// The last signal received since the handler was installed or the request cleared (0: none).
int stop_request();
void clear_stop_request();
std::string signal_name(int sig);  // "SIGTERM"

// The exit status the process should end with once the recipe's error unwinds: kExitStopped
// after a stop that saved its checkpoint (0: the usual status of the error).
void set_exit_status_override(int status);
int exit_status_override();

}  // namespace ctx
