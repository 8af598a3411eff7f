package console

import (
	"testing"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/api/enums/v1"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/sdk/converter"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gauntlet-rl/gauntlet/workflows"
)

// TestSummaryOf reads a curriculum's state as Temporal records it: the memo's state while
// it runs (paused included) and when it closed by itself; aborted for an abort (closed as
// canceled); what Temporal says for a workflow ended from outside, whatever the memo
// last held.
func TestSummaryOf(t *testing.T) {
	start, end := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC), time.Date(2026, 12, 1, 11, 0, 0, 0, time.UTC)
	info := func(status enums.WorkflowExecutionStatus, state string) *workflowpb.WorkflowExecutionInfo {
		memo := map[string]*commonpb.Payload{}
		dc := converter.GetDefaultDataConverter()
		for k, v := range map[string]any{workflows.MemoStage: 1, workflows.MemoStageName: "weather", workflows.MemoSubmittedBy: "ann@box"} {
			p, _ := dc.ToPayload(v)
			memo[k] = p
		}
		if state != "" {
			memo[workflows.MemoState], _ = dc.ToPayload(state)
		}
		i := &workflowpb.WorkflowExecutionInfo{
			Execution: &commonpb.WorkflowExecution{WorkflowId: "cur-1"}, Status: status,
			StartTime: timestamppb.New(start), Memo: &commonpb.Memo{Fields: memo},
		}
		if status != enums.WORKFLOW_EXECUTION_STATUS_RUNNING {
			i.CloseTime = timestamppb.New(end)
		}
		return i
	}
	for _, c := range []struct {
		status enums.WorkflowExecutionStatus
		memo   string
		state  string
		open   bool
	}{
		{enums.WORKFLOW_EXECUTION_STATUS_RUNNING, workflows.StatusRunning, workflows.StatusRunning, true},
		{enums.WORKFLOW_EXECUTION_STATUS_RUNNING, workflows.StatusPaused, workflows.StatusPaused, true},
		{enums.WORKFLOW_EXECUTION_STATUS_RUNNING, "", workflows.StatusRunning, true}, // started before the memo existed
		{enums.WORKFLOW_EXECUTION_STATUS_COMPLETED, workflows.StatusStopped, workflows.StatusStopped, false},
		{enums.WORKFLOW_EXECUTION_STATUS_COMPLETED, workflows.StatusSkipped, workflows.StatusSkipped, false},
		{enums.WORKFLOW_EXECUTION_STATUS_COMPLETED, workflows.StatusRunning, workflows.StatusCompleted, false},
		{enums.WORKFLOW_EXECUTION_STATUS_CANCELED, workflows.StatusAborted, workflows.StatusAborted, false},
		{enums.WORKFLOW_EXECUTION_STATUS_CANCELED, workflows.StatusPaused, StateCanceled, false},
		{enums.WORKFLOW_EXECUTION_STATUS_TERMINATED, workflows.StatusPaused, StateTerminated, false},
		{enums.WORKFLOW_EXECUTION_STATUS_FAILED, workflows.StatusRunning, StateFailed, false},
		{enums.WORKFLOW_EXECUTION_STATUS_TIMED_OUT, workflows.StatusRunning, StateTimedOut, false},
	} {
		s := summaryOf(info(c.status, c.memo))
		if s.State != c.state || s.Open != c.open || s.Stage != 1 || s.StageName != "weather" || s.SubmittedBy != "ann@box" || !s.Started.Equal(start) {
			t.Errorf("%v with memo state %q: %+v; want state %q, open %v, stage 1 weather by ann@box", c.status, c.memo, s, c.state, c.open)
		}
		if c.open != (s.Closed == nil) || (s.Closed != nil && !s.Closed.Equal(end)) {
			t.Errorf("%v: closed %v", c.status, s.Closed)
		}
	}
}
