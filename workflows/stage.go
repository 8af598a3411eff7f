package workflows

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// ActivityRecordStage is the activity that records a closed curriculum stage.
const ActivityRecordStage = "RecordStage"

// versionRecordStage is the change id under which curricula record their closed stages:
// workflows started before it replay without the activity.
const versionRecordStage = "record-stage-transitions"

// RecordStage puts a closed stage in the gauntlet_curricula KV bucket under
// "<curriculum prefix>.<stage>", where the store projects it into curriculum_stages.
// The key is the stage's identity, so a retry writes the same fact again.
func (a *Activities) RecordStage(ctx context.Context, t *gauntletv1.StageTransition) error {
	b := a.Bus()
	if b == nil {
		return errors.New("record stage: not connected to NATS yet")
	}
	kv, err := b.JS.KeyValue(ctx, bus.BucketCurricula)
	if err != nil {
		return fmt.Errorf("record stage %d of %s: open %s: %w", t.GetStage(), t.GetCurriculumId(), bus.BucketCurricula, err)
	}
	data, err := gauntletv1.Marshal(t)
	if err != nil {
		return fmt.Errorf("record stage %d of %s: %w", t.GetStage(), t.GetCurriculumId(), err)
	}
	key := fmt.Sprintf("%s.%d", t.GetCurriculumPrefix(), t.GetStage())
	if _, err := kv.Put(ctx, key, data); err != nil {
		return fmt.Errorf("record stage %d of %s: put %s/%s: %w", t.GetStage(), t.GetCurriculumId(), bus.BucketCurricula, key, err)
	}
	return nil
}

// recordStage records the stage the last closeStage closed (its last report). A failure
// is logged, not returned: the record is for analysts, and the curriculum goes on.
func (c *curriculum) recordStage(ctx workflow.Context) {
	if workflow.GetVersion(ctx, versionRecordStage, workflow.DefaultVersion, 1) == workflow.DefaultVersion {
		return
	}
	s := c.st
	if len(s.Reports) == 0 {
		return
	}
	r := s.Reports[len(s.Reports)-1]
	st := c.spec.Stages[r.Index]
	t := &gauntletv1.StageTransition{
		CurriculumId: workflow.GetInfo(ctx).WorkflowExecution.ID, CurriculumName: c.spec.Name, CurriculumPrefix: s.Prefix,
		Stage: uint32(r.Index), StageName: r.Name, Outcome: r.Outcome,
		Metric: st.Promotion.Metric, Threshold: st.Promotion.Threshold, Window: st.Promotion.Window, WindowValue: r.WindowValue,
		Episodes: r.Episodes, Succeeded: r.Succeeded, RewardSum: r.RewardSum, InfraErrors: r.InfraErrors, Batches: uint32(r.Batches),
		NextStage: uint32(s.Stage), ClosedAtUnixNano: workflow.Now(ctx).UnixNano(),
	}
	t.InfraKinds, t.InfraCounts = sortedKinds(r.InfraByKind)
	if r.Outcome != OutcomePromoted && r.Outcome != OutcomeSkipped {
		t.NextStage = uint32(len(c.spec.Stages)) // the curriculum ends here
	}
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 30 * time.Second,
		RetryPolicy:         &temporal.RetryPolicy{InitialInterval: 200 * time.Millisecond, MaximumInterval: 10 * time.Second, MaximumAttempts: 20},
	})
	if err := workflow.ExecuteActivity(actx, ActivityRecordStage, t).Get(ctx, nil); err != nil {
		workflow.GetLogger(ctx).Warn("stage transition not recorded", "stage", r.Index, "err", err)
	}
}
