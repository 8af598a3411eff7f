package trajectory

import (
	"testing"

	"google.golang.org/protobuf/proto"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// TestEncodedRowsMatchesRowsOf checks the wire count against the decoded one for every
// shape an event takes, and that malformed data is refused.
func TestEncodedRowsMatchesRowsOf(t *testing.T) {
	req := &gauntletv1.EpisodeRequested{EpisodeId: "e1", RunId: "r1", Env: "shop"}
	st := func(i uint32) *gauntletv1.StepTaken {
		return &gauntletv1.StepTaken{EpisodeId: "e1", RunId: "r1", Step: i, ObservationJson: `{"ok":true}`,
			Faults: []*gauntletv1.FaultFired{{FaultId: "f", Kind: "latency"}}}
	}
	end := &gauntletv1.EpisodeEnded{Episode: req, Steps: 3, Plan: &gauntletv1.FaultPlan{Profile: "edge"}}
	events := []*gauntletv1.Event{
		{},
		{Body: &gauntletv1.Event_Started{Started: &gauntletv1.EpisodeStarted{Episode: req}}},
		{Body: &gauntletv1.Event_Step{Step: st(0)}},
		{Body: &gauntletv1.Event_Ended{Ended: end}},
		{Body: &gauntletv1.Event_Steps{Steps: &gauntletv1.StepsTaken{Steps: []*gauntletv1.StepTaken{st(0), st(1)}}}},
		{Body: &gauntletv1.Event_Steps{Steps: &gauntletv1.StepsTaken{Started: &gauntletv1.EpisodeStarted{Episode: req}, Steps: []*gauntletv1.StepTaken{st(0), st(1), st(2)}, Ended: end}}},
		{Body: &gauntletv1.Event_Steps{Steps: &gauntletv1.StepsTaken{Ended: end}}},
	}
	batch := func(evs ...*gauntletv1.Event) *gauntletv1.Event {
		return &gauntletv1.Event{Body: &gauntletv1.Event_Batch{Batch: &gauntletv1.EventBatch{Events: evs}}}
	}
	events = append(events,
		batch(events[1:]...),
		batch(),
		// A batch in a batch projects to nothing, on the wire as decoded.
		batch(events[3], batch(events[5])),
	)
	for i, ev := range events {
		data, err := proto.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		got, err := EncodedRows(data)
		if err != nil || got != RowsOf(ev) {
			t.Errorf("event %d: EncodedRows = %d, %v; RowsOf = %d", i, got, err, RowsOf(ev))
		}
	}
	for _, bad := range [][]byte{{0xff}, {0x22, 0x05, 0x0a}, {0x22, 0x02, 0x0a, 0x09}} {
		if n, err := EncodedRows(bad); err == nil {
			t.Errorf("EncodedRows(%x) = %d, want an error", bad, n)
		}
	}
}

// TestForkLineageProjected: a forked episode's parent and step reach its episodes row,
// and an episode that is no fork has neither.
func TestForkLineageProjected(t *testing.T) {
	for _, c := range []struct {
		parent string
		step   uint32
	}{{"api-acme-1", 7}, {"", 0}} {
		req := &gauntletv1.EpisodeRequested{EpisodeId: "api-acme-2", RunId: "api-acme", Env: "shop", ParentEpisodeId: c.parent, ParentStep: c.step}
		row, err := newEpisodeRow(&gauntletv1.EpisodeEnded{Episode: req, Steps: 9})
		if err != nil {
			t.Fatal(err)
		}
		if row.ParentEpisodeID != c.parent || row.ParentStep != c.step {
			t.Errorf("row of a fork of %q at %d: parent %q at %d", c.parent, c.step, row.ParentEpisodeID, row.ParentStep)
		}
	}
}

// TestRunRowRecordsTheLogprobsChoice: a run's choice of token ids and logprobs reaches
// its runs row as on, off, or empty for a run that left it to its workers.
func TestRunRowRecordsTheLogprobsChoice(t *testing.T) {
	for l, want := range map[gauntletv1.Logprobs]string{
		gauntletv1.Logprobs_LOGPROBS_UNSPECIFIED: "",
		gauntletv1.Logprobs_LOGPROBS_ON:          LogprobsOn,
		gauntletv1.Logprobs_LOGPROBS_OFF:         LogprobsOff,
	} {
		s := &gauntletv1.RunState{Spec: &gauntletv1.RunRequested{RunId: "r1", Policies: []*gauntletv1.Share{{Name: "http", Weight: 1}},
			PolicyEndpoint: &gauntletv1.PolicyEndpoint{Url: "http://h/v1", Logprobs: l}}}
		if got := RunRowOf(s).PolicyLogprobs; got != want {
			t.Errorf("%v: policy_logprobs %q, want %q", l, got, want)
		}
	}
	if got := RunRowOf(&gauntletv1.RunState{Spec: &gauntletv1.RunRequested{RunId: "r2"}}).PolicyLogprobs; got != "" {
		t.Errorf("a run without an endpoint: policy_logprobs %q, want empty", got)
	}
}
