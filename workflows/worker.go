package workflows

import (
	"context"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/play"
)

// Activities holds what gauntlet's activities need: a NATS connection to submit runs,
// read run state, ask for plans and scores, and publish a durable episode's events.
// Safe for concurrent use by any number of activity executions.
type Activities struct {
	// Bus returns the connection; nil until it is open.
	Bus func() *bus.Bus
	// WorkerID names this process in the events of durable episodes.
	WorkerID string
	// Version is the gauntlet build of this process, recorded with the runs it submits.
	Version string
	// Play builds durable episodes and their agents: the sandboxes of this process's
	// runtime, if any, and its configured policies; without Templates, the template store
	// of the bus.
	Play play.Deps
	// AfterStep, when set, is called after each durable-episode step is in the stream
	// and in the heartbeat; tests use it to stop a worker at a known step.
	AfterStep func(ctx context.Context, episodeID string, step uint32)
}

// Register registers gauntlet's workflows and activities on a worker under their stable
// names (WorkflowCurriculum, ActivityRunBatch, ...).
func Register(r worker.Registry, a *Activities) {
	r.RegisterWorkflowWithOptions(Curriculum, workflow.RegisterOptions{Name: WorkflowCurriculum})
	r.RegisterWorkflowWithOptions(Batch, workflow.RegisterOptions{Name: WorkflowBatch})
	r.RegisterWorkflowWithOptions(DurableEpisode, workflow.RegisterOptions{Name: WorkflowEpisode})
	r.RegisterActivityWithOptions(a.RunBatch, activity.RegisterOptions{Name: ActivityRunBatch})
	r.RegisterActivityWithOptions(a.PlayEpisode, activity.RegisterOptions{Name: ActivityPlayEpisode})
	r.RegisterActivityWithOptions(a.RecordStage, activity.RegisterOptions{Name: ActivityRecordStage})
}
