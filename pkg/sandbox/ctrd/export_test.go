package ctrd

import (
	"time"

	"github.com/containerd/containerd/v2/pkg/oci"
)

// Phases is startPhases for the external tests.
type Phases = startPhases

// SetSpecHook makes every later start pass its OCI spec through f.
func SetSpecHook(r *Runtime, f func(*oci.Spec)) { r.specHook = f }

// SetPhaseHook makes every later start report its phase timings to f.
func SetPhaseHook(r *Runtime, f func(Phases)) { r.phaseHook = f }

// SetNoAgentWait makes a start ready once the task runs, without waiting for the agent.
func SetNoAgentWait(r *Runtime, on bool) { r.noAgent = on }

// SetNoPrecompiledSeccomp makes crun compile the seccomp profile itself.
func SetNoPrecompiledSeccomp(r *Runtime, on bool) { r.noBPFCache = on }

// SetAgentPoll sets the longest pause between probes of a new sandbox's agent.
func SetAgentPoll(r *Runtime, d time.Duration) { r.agentPoll = d }

// SetShimStart turns the shim start script (shimstart.go) on or off for later starts.
func SetShimStart(r *Runtime, on bool) { r.noShimStart = !on }

// SandboxDir is the runtime's state directory of sandbox id.
func SandboxDir(r *Runtime, id string) string { return r.sandboxDir(id) }

// SetClientNewTask makes later starts create their task through the client's NewTask.
func SetClientNewTask(r *Runtime, on bool) { r.clientNewTask = on }
