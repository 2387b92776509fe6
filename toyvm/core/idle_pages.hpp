#pragma once
// A long-running service's start-up code (gRPC's and protobuf's static initialisation,
// registration) runs once, and a burst of work runs code that then lies idle, but their pages
// stay mapped and counted in the process's memory.

namespace toyvm {

// Hands the pages of toyvm's own executable back to the kernel, read-only ones only (code and
// constants; relocated data stays), and lets go of its mappings of the read-only pages of every
// file it maps (the executable's that other processes keep in memory, the libraries'). What the
// service runs afterwards is faulted in again from the page cache or the file. Best effort:
// kernels before 5.4 lack MADV_PAGEOUT.
void release_idle_pages();

}  // namespace toyvm
