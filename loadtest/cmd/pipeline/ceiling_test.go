package main

import (
	"context"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// TestGenerate checks that the ceiling's events have the worker's shape: per episode
// segments of at most segmentSteps consecutive scored steps, the first carrying the start
// and the last the end with its plan and the step count; and that batches keep every
// event.
func TestGenerate(t *testing.T) {
	c, err := generate(context.Background(), "oracle", 500)
	if err != nil {
		t.Fatal(err)
	}
	if c.steps < 500 || c.episodes == 0 {
		t.Fatalf("generated %d steps in %d episodes, want at least 500 steps", c.steps, c.episodes)
	}
	started, ended, steps := 0, 0, 0
	next := map[string]uint32{} // episode -> next expected step
	for _, ev := range c.events {
		b, ok := ev.GetBody().(*gauntletv1.Event_Steps)
		if !ok {
			t.Fatalf("unexpected event %T", ev.GetBody())
		}
		seg := b.Steps.GetSteps()
		if len(seg) == 0 || len(seg) > segmentSteps {
			t.Fatalf("segment of %d steps", len(seg))
		}
		if s := b.Steps.GetStarted(); s != nil {
			started++
			if seg[0].GetStep() != 0 || s.GetEpisode().GetEpisodeId() != seg[0].GetEpisodeId() {
				t.Fatalf("start of %s rides on a segment from step %d of %s", s.GetEpisode().GetEpisodeId(), seg[0].GetStep(), seg[0].GetEpisodeId())
			}
		}
		for _, st := range seg {
			if st.GetStep() != next[st.GetEpisodeId()] {
				t.Fatalf("%s: step %d, want %d", st.GetEpisodeId(), st.GetStep(), next[st.GetEpisodeId()])
			}
			next[st.GetEpisodeId()]++
			if st.GetScore().GetSpecVersion() == "" || len(st.GetScore().GetComponents()) == 0 {
				t.Fatalf("%s step %d is not scored: %v", st.GetEpisodeId(), st.GetStep(), st.GetScore())
			}
			if st.GetObservationJson() == "" || st.GetProfile() == "" {
				t.Fatalf("%s step %d lacks observation or profile", st.GetEpisodeId(), st.GetStep())
			}
			steps++
		}
		if e := b.Steps.GetEnded(); e != nil {
			ended++
			if e.GetPlan() == nil || e.GetPlan().GetProfile() != e.GetProfile() {
				t.Fatalf("%s ended without its plan", e.GetEpisode().GetEpisodeId())
			}
			if e.GetSteps() != next[e.GetEpisode().GetEpisodeId()] {
				t.Fatalf("%s ended after %d steps, %d published", e.GetEpisode().GetEpisodeId(), e.GetSteps(), next[e.GetEpisode().GetEpisodeId()])
			}
		}
	}
	if started != c.episodes || ended != c.episodes || steps != c.steps {
		t.Fatalf("%d started, %d ended, %d steps; corpus says %d episodes, %d steps", started, ended, steps, c.episodes, c.steps)
	}
	total := 0
	batches := c.batches(40)
	for i, b := range batches {
		rows := 0
		for _, ev := range b {
			rows += trajectory.RowsOf(ev)
		}
		// A batch closes at the event that reaches 40 rows: it holds at least 40 (but the
		// last) and less than 40 before its last event (at most 33 rows: 32 steps + end).
		if (i < len(batches)-1 && rows < 40) || rows >= 40+33 {
			t.Fatalf("batch %d holds %d rows, want 40 up to 72", i, rows)
		}
		total += len(b)
	}
	if total != len(c.events) {
		t.Fatalf("batches hold %d events, corpus %d", total, len(c.events))
	}
}
