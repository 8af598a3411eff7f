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
	} {
		subj, id, err := EventSubject(c.ev)
		if (err != nil) != c.wantError || subj != c.subj || id != c.id {
			t.Errorf("%s: %q, %q, %v; want %q, %q (error %v)", c.name, subj, id, err, c.subj, c.id, c.wantError)
		}
	}
}
