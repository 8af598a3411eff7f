// Package boundary applies an episode's faults at its sandbox's boundaries, so that any
// env whose episodes run in a sandbox gets them by opening one Layer, without copying:
//
//   - storage faults (the plan's boundary_spec) reach the file tools through a
//     faultfs.Gate (Layer.Gate) over a Decider keyed by the plan's seed, spending their
//     delays on the episode's virtual clock; and, when the runtime is a
//     sandbox.StorageFaulter, the agent's commands through a second gate the runtime's
//     filesystem layer (package faultfuse) passes every file operation through;
//   - resource faults are decided once per episode (inject.ResourcesFor) and written
//     through the runtime's cgroup knobs (sandbox.LimitUpdater) before every tool call
//     (Layer.Begin): cpu_throttle as the CPU quota, memory_leak as a memory limit
//     shrinking with the episode's virtual time;
//   - clock_skew goes into the environment of the agent's commands (Layer.ExecEnv)
//     through the runtime's sandbox.ClockSkewer (process: libfaketime); a runtime
//     without it records the fault as not applied;
//   - the sandbox's services (sandbox.Spec.Services) are reached through the fault
//     gateway of package svcnet, where the plan's rules for them and its DNS faults
//     apply.
//
// The runtime's optional abilities are found by type assertion. Every fault that fires
// becomes a FaultFired the env records on the step that met it: those of a tool call
// (Layer.Fired, target "<target>/<tool>", detail "<op> <path>: <what>"), of a command
// (moved there by Layer.CommandDone), of the services (Layer.ServiceFaults), and the
// resource faults in force, recorded once on the first step (Layer.Ambient).
//
// A Layer belongs to one episode and is used by one goroutine at a time, like the
// episode; the runtime's filesystem layer and the gateway call into it from their own
// goroutines through locked or atomic state only. Close puts the sandbox's own limits
// back and detaches everything before the sandbox leaves the episode; errors name the
// env that opened the layer.
package boundary
