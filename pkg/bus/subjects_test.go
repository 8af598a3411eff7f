package bus

import (
	"testing"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

func TestEventSubject(t *testing.T) {
	req := &gauntletv1.EpisodeRequested{EpisodeId: "e1", RunId: "r1"}
	steps := []*gauntletv1.StepTaken{{EpisodeId: "e1", RunId: "r1", Step: 3}, {EpisodeId: "e1", RunId: "r1", Step: 4}}
	seg := func(s []*gauntletv1.StepTaken, start bool, end bool) *gauntletv1.Event {
		st := &gauntletv1.StepsTaken{Steps: s}
		if start {
			st.Started = &gauntletv1.EpisodeStarted{Episode: req}
		}
		if end {
			st.Ended = &gauntletv1.EpisodeEnded{Episode: req}
		}
		return &gauntletv1.Event{Body: &gauntletv1.Event_Steps{Steps: st}}
	}
	req2 := &gauntletv1.EpisodeRequested{EpisodeId: "e2", RunId: "r1"}
	other := &gauntletv1.EpisodeRequested{EpisodeId: "x1", RunId: "r2"}
	lone := func(r *gauntletv1.EpisodeRequested) *gauntletv1.Event {
		return &gauntletv1.Event{Body: &gauntletv1.Event_Ended{Ended: &gauntletv1.EpisodeEnded{Episode: r}}}
	}
	batch := func(evs ...*gauntletv1.Event) *gauntletv1.Event {
		return &gauntletv1.Event{Body: &gauntletv1.Event_Batch{Batch: &gauntletv1.EventBatch{Events: evs}}}
	}
	for _, c := range []struct {
		name      string
		ev        *gauntletv1.Event
		subj, id  string
		wantError bool
	}{
		{"lone start", &gauntletv1.Event{Body: &gauntletv1.Event_Started{Started: &gauntletv1.EpisodeStarted{Episode: req}}}, "gauntlet.ev.started.r1", "e1/started", false},
		{"lone end", &gauntletv1.Event{Body: &gauntletv1.Event_Ended{Ended: &gauntletv1.EpisodeEnded{Episode: req}}}, "gauntlet.ev.ended.r1", "e1/ended", false},
		{"segment", seg(steps, false, false), "gauntlet.ev.steps.r1", "e1/steps/3-4", false},
		// The start does not change the id: a re-run's first segment de-duplicates.
		{"first segment", seg(steps, true, false), "gauntlet.ev.steps.r1", "e1/steps/3-4", false},
		{"last segment", seg(steps, false, true), "gauntlet.ev.ended.r1", "e1/steps/3-4/ended", false},
		{"whole episode", seg(steps, true, true), "gauntlet.ev.ended.r1", "e1/steps/3-4/ended", false},
		{"end without steps", seg(nil, true, true), "gauntlet.ev.ended.r1", "e1/ended", false},
		{"empty segment", seg(nil, true, false), "", "", true},
		{"no body", &gauntletv1.Event{}, "", "", true},
		{"batch of ends", batch(seg(steps, true, true), lone(req2)), "gauntlet.ev.ended.r1", "e1/steps/3-4/ended..e2/ended", false},
		{"batch of segments", batch(seg(steps, true, false), seg(steps, false, false)), "gauntlet.ev.steps.r1", "e1/steps/3-4..e1/steps/3-4", false},
		{"batch with one end", batch(seg(steps, false, false), lone(req2)), "gauntlet.ev.ended.r1", "e1/steps/3-4..e2/ended", false},
		{"batch across runs", batch(lone(req2), lone(other)), "", "", true},
		{"nested batch", batch(batch(lone(req2))), "", "", true},
		{"batch with a bad event", batch(lone(req2), &gauntletv1.Event{}), "", "", true},
		{"empty batch", batch(), "", "", true},
	} {
		subj, id, err := EventSubject(c.ev)
		if (err != nil) != c.wantError || subj != c.subj || id != c.id {
			t.Errorf("%s: %q, %q, %v; want %q, %q (error %v)", c.name, subj, id, err, c.subj, c.id, c.wantError)
		}
	}
}

func TestEventMsgHeadersEveryEnd(t *testing.T) {
	end := func(id string, idx uint64) *gauntletv1.Event {
		return &gauntletv1.Event{Body: &gauntletv1.Event_Ended{Ended: &gauntletv1.EpisodeEnded{
			Episode: &gauntletv1.EpisodeRequested{EpisodeId: id, RunId: "r1", Index: idx}, Steps: uint32(idx)}}}
	}
	mid := &gauntletv1.Event{Body: &gauntletv1.Event_Steps{Steps: &gauntletv1.StepsTaken{
		Steps: []*gauntletv1.StepTaken{{EpisodeId: "e9", RunId: "r1", Step: 0}}}}}
	ev := &gauntletv1.Event{Body: &gauntletv1.Event_Batch{Batch: &gauntletv1.EventBatch{
		Events: []*gauntletv1.Event{end("e1", 1), mid, end("e2", 2)}}}}
	m, _, err := eventMsg(ev)
	if err != nil {
		t.Fatal(err)
	}
	vals := m.Header.Values(HeaderEnded)
	if len(vals) != 2 {
		t.Fatalf("%d %s values, want one per end (2)", len(vals), HeaderEnded)
	}
	for i, v := range vals {
		sum, err := DecodeEndedHeader(v)
		if err != nil {
			t.Fatal(err)
		}
		if want := uint64(i + 1); sum.GetEpisode().GetIndex() != want || sum.GetSteps() != uint32(want) {
			t.Errorf("value %d: %v, want the end of episode %d", i, sum, want)
		}
	}
	m, _, err = eventMsg(mid)
	if err != nil {
		t.Fatal(err)
	}
	if m.Header != nil {
		t.Errorf("a segment without an end got headers %v", m.Header)
	}
}
