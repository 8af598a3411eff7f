package play

import (
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// StepEvent's strings share one copy of the step's bytes: the event must hold what the
// step was, whatever the env or the policy does to their buffers afterwards.
func TestStepEventCopiesTheStep(t *testing.T) {
	req := &gauntletv1.EpisodeRequested{EpisodeId: "r-1", RunId: "r", Env: "shop", Policy: "oracle", RequestedAtUnixNano: 7}
	act := env.Action{Tool: "inventory.get", Args: []byte(`{"sku":"a"}`)}
	res := env.StepResult{
		Observation: []byte(`{"ok":true}`), Diff: []byte(`[]`), Signals: &gauntletv1.Signals{Progress: 0.5},
		Metering: &gauntletv1.Metering{ToolCalls: 1}, Terminated: true, Reason: gauntletv1.TerminationReason_TERMINATION_REASON_SUCCESS,
	}
	st := StepEvent(req, "stress", "w-1", 3, act, res, 2*time.Second)
	for _, b := range [][]byte{act.Args, res.Observation, res.Diff} {
		for i := range b {
			b[i] = 'x'
		}
	}
	if st.Action.Tool != "inventory.get" || st.Action.ArgsJson != `{"sku":"a"}` || st.ObservationJson != `{"ok":true}` || st.StateDiffJson != `[]` {
		t.Fatalf("event's bytes changed with the step's buffers: %q %q %q", st.Action.ArgsJson, st.ObservationJson, st.StateDiffJson)
	}
	if st.EpisodeId != "r-1" || st.Step != 3 || st.RunId != "r" || st.Env != "shop" || st.Policy != "oracle" || st.Profile != "stress" ||
		st.WorkerId != "w-1" || st.VirtualTimeNs != int64(2*time.Second) || st.RequestedAtUnixNano != 7 ||
		!st.Terminated || st.Reason != res.Reason || st.Signals != res.Signals || st.Metering != res.Metering {
		t.Fatalf("event = %v", st)
	}
	empty := StepEvent(req, "", "", 0, env.Action{Tool: "wait"}, env.StepResult{}, 0)
	if empty.Action.ArgsJson != "" || empty.ObservationJson != "" || empty.StateDiffJson != "" {
		t.Fatalf("empty step = %v", empty)
	}
}
