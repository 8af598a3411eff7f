// Package sandbox defines what a sandbox runtime is to gauntlet: the Runtime
// interface every backend implements (process, containerd, …), the optional abilities a
// backend may add (Snapshotter, Forker, UserForker, WorkspaceDirer), the Spec a sandbox
// is created from, the Metering an exec reports, and the sentinel errors callers test
// with errors.Is.
//
// The shape follows Nomad's task driver: a runtime creates sandboxes and returns a Handle
// carrying the runtime's private state; the worker may persist that Handle, and after a
// worker restart a fresh Runtime built over the same state directory lists and recovers
// every sandbox that still exists (List, Recover). Optional abilities are separate
// interfaces found by type assertion, so a runtime that cannot fork is still a Runtime.
//
// Contract shared by every runtime (checked by package sandboxtest's conformance suite):
//   - A sandbox has a workspace, seen inside the sandbox at WorkspacePath. It persists across
//     execs of one sandbox and is never visible to another sandbox.
//   - Exec runs one command to completion (or until its timeout) and returns its exit code,
//     its output capped at the requested size, and what the sandbox measured. A command that
//     fails, times out or is killed for exceeding a limit is a result, not a Go error; Go
//     errors mean the runtime itself failed or the request was invalid.
//   - Execs of one sandbox may be issued concurrently; runtimes may serialise them.
//     Snapshot, Restore and Destroy wait for running execs of that sandbox to finish.
//   - Snapshots outlive the sandbox they were taken from until DeleteSnapshot; Fork makes a
//     new, independent sandbox from a snapshot.
//   - Runtime values are safe for concurrent use by many goroutines. Close releases the
//     runtime's own resources but leaves sandboxes running, so they can be recovered.
package sandbox
