#pragma once
// A long-running service's start-up code (gRPC's and protobuf's static initialisation,
// registration) runs once, and a burst of work runs code that then lies idle, but their pages
// stay mapped and counted in the process's memory.

#include <cstdint>

namespace toyvm {

// Hands the pages of toyvm's own executable back to the kernel, read-only ones only (code and
// constants; relocated data stays), and lets go of its mappings of the read-only pages of every
// file it maps (the executable's that other processes keep in memory, the libraries'). What the
// service runs afterwards is faulted in again from the page cache or the file. Best effort:
// kernels before 5.4 lack MADV_PAGEOUT.
void release_idle_pages();

// The CPU time the whole process has used so far (every thread's, user and system), in
// microseconds: how a service tells a burst of work from its idle ticking.
uint64_t process_cpu_micros();

}  // namespace toyvm
