package workflows

import (
	"strings"
	"testing"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/api/enums/v1"
	failurepb "go.temporal.io/api/failure/v1"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/sdk/converter"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func TestBatchWaitingSaysWhatAStalledBatchWaitsFor(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	hb := func(h BatchHeartbeat) *commonpb.Payloads {
		p, err := converter.GetDefaultDataConverter().ToPayloads(h)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	ago := func(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(now.Add(-d)) }
	batch := &commonpb.ActivityType{Name: ActivityRunBatch}
	for _, tt := range []struct {
		name string
		pa   *workflowpb.PendingActivityInfo
		want []string // "" for no waiting line
	}{
		{"progressing", &workflowpb.PendingActivityInfo{ActivityType: batch, State: enums.PENDING_ACTIVITY_STATE_STARTED, Attempt: 1,
			LastHeartbeatTime: ago(time.Second), HeartbeatDetails: hb(BatchHeartbeat{RunID: "c1-s0-b3", Episodes: 20, Assigned: 20, Ended: 5, UpdatedAtUnixNano: now.Add(-time.Second).UnixNano()})}, nil},
		{"worker gone", &workflowpb.PendingActivityInfo{ActivityType: batch, State: enums.PENDING_ACTIVITY_STATE_STARTED, Attempt: 1, LastWorkerIdentity: "w1",
			LastHeartbeatTime: ago(12 * time.Second), HeartbeatDetails: hb(BatchHeartbeat{RunID: "c1-s0-b3", Episodes: 20})},
			[]string{"waiting for batch c1-s0-b3: its worker w1 has not reported for 12s", "5s heartbeat timeout"}},
		{"retry queued", &workflowpb.PendingActivityInfo{ActivityType: batch, State: enums.PENDING_ACTIVITY_STATE_SCHEDULED, Attempt: 2,
			LastFailure: &failurepb.Failure{Message: "activity Heartbeat timeout"}, HeartbeatDetails: hb(BatchHeartbeat{RunID: "c1-s0-b3"})},
			[]string{"waiting for a Temporal worker to resume batch c1-s0-b3, attempt 2", "activity Heartbeat timeout"}},
		{"episodes held", &workflowpb.PendingActivityInfo{ActivityType: batch, State: enums.PENDING_ACTIVITY_STATE_STARTED, Attempt: 2,
			LastHeartbeatTime: ago(time.Second), HeartbeatDetails: hb(BatchHeartbeat{RunID: "c1-s0-b3", Episodes: 20, Assigned: 20, Ended: 12, UpdatedAtUnixNano: now.Add(-20 * time.Second).UnixNano()})},
			[]string{"waiting for batch c1-s0-b3: 12 of 20 episodes ended, 8 in flight, none ended for 20s", "--worker.ack-wait"}},
		{"run not accepted yet", &workflowpb.PendingActivityInfo{ActivityType: batch, State: enums.PENDING_ACTIVITY_STATE_STARTED, Attempt: 2,
			LastStartedTime: ago(15 * time.Second), LastHeartbeatTime: ago(time.Second), HeartbeatDetails: hb(BatchHeartbeat{RunID: "c1-s0-b3", Episodes: 20})},
			[]string{"waiting for the scheduler to accept run c1-s0-b3", "submitted 15s ago"}},
		{"resumed batch's run not accepted yet", &workflowpb.PendingActivityInfo{ActivityType: batch, State: enums.PENDING_ACTIVITY_STATE_STARTED, Attempt: 2,
			LastStartedTime: ago(time.Second), LastHeartbeatTime: ago(time.Second), HeartbeatDetails: hb(BatchHeartbeat{RunID: "c1-s0-b3", Episodes: 20})},
			[]string{"waiting for the scheduler to accept run c1-s0-b3", "attempt 2"}},
		{"run just submitted", &workflowpb.PendingActivityInfo{ActivityType: batch, State: enums.PENDING_ACTIVITY_STATE_STARTED, Attempt: 1,
			LastStartedTime: ago(time.Second), LastHeartbeatTime: ago(time.Second), HeartbeatDetails: hb(BatchHeartbeat{RunID: "c1-s0-b3", Episodes: 20})}, nil},
		{"first attempt not started", &workflowpb.PendingActivityInfo{ActivityType: batch, State: enums.PENDING_ACTIVITY_STATE_SCHEDULED, Attempt: 1,
			ScheduledTime: ago(8 * time.Second)},
			[]string{"waiting for a Temporal worker to start the batch in flight, scheduled 8s ago"}},
		{"first attempt just scheduled", &workflowpb.PendingActivityInfo{ActivityType: batch, State: enums.PENDING_ACTIVITY_STATE_SCHEDULED, Attempt: 1,
			ScheduledTime: ago(time.Second)}, nil},
		{"other activity", &workflowpb.PendingActivityInfo{ActivityType: &commonpb.ActivityType{Name: ActivityPlayEpisode}, State: enums.PENDING_ACTIVITY_STATE_SCHEDULED, Attempt: 5}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := BatchWaiting(tt.pa, now)
			if len(tt.want) == 0 && got != "" {
				t.Fatalf("waiting %q; want none", got)
			}
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("waiting %q\ndoes not contain %q", got, w)
				}
			}
		})
	}
	wt := &workflowpb.PendingWorkflowTaskInfo{State: enums.PENDING_WORKFLOW_TASK_STATE_SCHEDULED, ScheduledTime: ago(9 * time.Second), Attempt: 1}
	if got := WorkflowTaskWaiting(wt, now); !strings.Contains(got, "waiting for a Temporal worker polling task queue gauntlet") || !strings.Contains(got, "queued 9s ago") {
		t.Errorf("workflow task waiting %q", got)
	}
	wt.ScheduledTime = ago(time.Second)
	if got := WorkflowTaskWaiting(wt, now); got != "" {
		t.Errorf("workflow task waiting %q for a fresh task", got)
	}
	// A retried task counts its wait from its first scheduling.
	wt.Attempt, wt.OriginalScheduledTime = 2, ago(14*time.Second)
	if got := WorkflowTaskWaiting(wt, now); !strings.Contains(got, "queued 14s ago, attempt 2") {
		t.Errorf("retried workflow task waiting %q", got)
	}
	// Taken by a worker that then stopped (killed with the process): nothing happens until
	// Temporal's workflow task timeout; say so rather than nothing.
	wt = &workflowpb.PendingWorkflowTaskInfo{State: enums.PENDING_WORKFLOW_TASK_STATE_STARTED, ScheduledTime: ago(8 * time.Second), StartedTime: ago(7 * time.Second), Attempt: 1}
	if got := WorkflowTaskWaiting(wt, now); !strings.Contains(got, "a worker took it 7s ago and has not finished it") {
		t.Errorf("started workflow task waiting %q", got)
	}
	wt.StartedTime = ago(time.Second)
	if got := WorkflowTaskWaiting(wt, now); got != "" {
		t.Errorf("workflow task waiting %q for a task just taken", got)
	}
}
