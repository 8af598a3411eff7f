package workflows

import (
	"fmt"
	"time"

	"go.temporal.io/api/enums/v1"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/sdk/converter"
)

// stallAfter is how long a batch may go without an episode ending before
// BatchWaiting calls it stalled (a batch of the shop env ends episodes every few
// milliseconds; a minute-long codefix episode may exceed it honestly, and the message
// then says no more than what is true: which episodes are in flight and for how long
// none ended).
const stallAfter = 5 * time.Second

// BatchWaiting says what a curriculum's batch in flight waits for, from Temporal's view
// of the pending RunBatch activity (DescribeWorkflowExecution): its attempt, the last
// heartbeat (BatchHeartbeat) and the last attempt's failure. It is "" while the batch
// makes progress, and for any other activity. The workflow cannot see these (they live
// in Temporal's pending-activity record, not in its history), so `gauntlet curriculum
// status` asks Temporal and adds the answer to the progress (Progress.Waiting).
func BatchWaiting(pa *workflowpb.PendingActivityInfo, now time.Time) string {
	if pa.GetActivityType().GetName() != ActivityRunBatch {
		return ""
	}
	var hb BatchHeartbeat
	if d := pa.GetHeartbeatDetails(); d != nil {
		_ = converter.GetDefaultDataConverter().FromPayloads(d, &hb)
	}
	batch := "the batch in flight"
	if hb.RunID != "" {
		batch = "batch " + hb.RunID
	}
	since := func(t time.Time) string { return now.Sub(t).Round(time.Second).String() }
	lastFailure := ""
	if f := pa.GetLastFailure(); f != nil {
		lastFailure = "; its last attempt ended: " + boundMessage(f.GetMessage())
	}
	switch pa.GetState() {
	case enums.PENDING_ACTIVITY_STATE_SCHEDULED:
		if pa.GetAttempt() <= 1 {
			// Not started yet: say so once it has waited longer than a worker takes to
			// poll (after a restart, before the new worker polls).
			t := pa.GetScheduledTime()
			if t == nil || now.Sub(t.AsTime()) <= stallAfter {
				return ""
			}
			return fmt.Sprintf("waiting for a Temporal worker to start %s, scheduled %s ago", batch, since(t.AsTime()))
		}
		at := ""
		if t := pa.GetNextAttemptScheduleTime(); t != nil && t.AsTime().After(now) {
			at = fmt.Sprintf(" (retry due in %s)", t.AsTime().Sub(now).Round(100*time.Millisecond))
		}
		return fmt.Sprintf("waiting for a Temporal worker to resume %s, attempt %d%s%s", batch, pa.GetAttempt(), at, lastFailure)
	case enums.PENDING_ACTIVITY_STATE_STARTED:
		last := pa.GetLastHeartbeatTime()
		if last == nil {
			last = pa.GetLastStartedTime()
		}
		if last != nil && now.Sub(last.AsTime()) > BatchHeartbeatTimeout {
			return fmt.Sprintf("waiting for %s: its worker %s has not reported for %s (stopped or stuck; Temporal hands the batch to a live worker once the %s heartbeat timeout has passed)",
				batch, pa.GetLastWorkerIdentity(), since(last.AsTime()), BatchHeartbeatTimeout)
		}
		if hb.UpdatedAtUnixNano == 0 {
			// The scheduler has not accepted the batch's run yet. A run request a
			// scheduler took and could not acknowledge (it was killed) is delivered
			// again only after the request's lease; say so rather than nothing.
			// A first attempt gets stallAfter to have its run accepted; a later one is a
			// batch resuming after a failure, whose wait is worth saying at once.
			started := pa.GetLastStartedTime()
			if hb.RunID == "" || started == nil || pa.GetAttempt() <= 1 && now.Sub(started.AsTime()) <= stallAfter {
				return ""
			}
			return fmt.Sprintf("waiting for the scheduler to accept run %s, submitted %s ago (attempt %d; a request held by a scheduler that stopped is delivered again when its lease runs out)%s",
				hb.RunID, since(started.AsTime()), pa.GetAttempt(), lastFailure)
		}
		if hb.Ended >= hb.Episodes {
			return ""
		}
		updated := time.Unix(0, hb.UpdatedAtUnixNano)
		if now.Sub(updated) <= stallAfter {
			return ""
		}
		inFlight := hb.Assigned - min(hb.Ended, hb.Assigned)
		return fmt.Sprintf("waiting for %s: %d of %d episodes ended, %d in flight, none ended for %s (attempt %d; episodes held by a worker that stopped are handed out again when their lease, --worker.ack-wait, runs out)%s",
			batch, hb.Ended, hb.Episodes, inFlight, since(updated), pa.GetAttempt(), lastFailure)
	}
	return ""
}

// WorkflowTaskWaiting says what a curriculum waits for when its next workflow task (the
// decision after a batch, a signal or a restart) has waited longer than stallAfter: for a
// worker to take it (counted from its first scheduling, across retries), or for the
// worker that took it to finish (a worker killed meanwhile holds it until Temporal's
// workflow task timeout). "" otherwise.
func WorkflowTaskWaiting(wt *workflowpb.PendingWorkflowTaskInfo, now time.Time) string {
	switch wt.GetState() {
	case enums.PENDING_WORKFLOW_TASK_STATE_SCHEDULED:
		t := wt.GetOriginalScheduledTime()
		if t == nil {
			t = wt.GetScheduledTime()
		}
		if t == nil || now.Sub(t.AsTime()) <= stallAfter {
			return ""
		}
		return fmt.Sprintf("waiting for a Temporal worker polling task queue %s to run the curriculum's next step (queued %s ago, attempt %d)",
			TaskQueue, now.Sub(t.AsTime()).Round(time.Second), wt.GetAttempt())
	case enums.PENDING_WORKFLOW_TASK_STATE_STARTED:
		t := wt.GetStartedTime()
		if t == nil || now.Sub(t.AsTime()) <= stallAfter {
			return ""
		}
		return fmt.Sprintf("waiting for the curriculum's next step: a worker took it %s ago and has not finished it (if that worker stopped, Temporal hands the step to another once its workflow task timeout has passed; attempt %d)",
			now.Sub(t.AsTime()).Round(time.Second), wt.GetAttempt())
	}
	return ""
}
