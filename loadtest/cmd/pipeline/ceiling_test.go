package main

import (
	"context"
	"testing"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// TestGenerate checks that the ceiling's events have the worker's shape: per episode one
// started, segments of at most segmentSteps consecutive scored steps, one ended with its
// plan and the step count; and that batches keep every event.
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
		switch b := ev.GetBody().(type) {
		case *gauntletv1.Event_Started:
			started++
			next[b.Started.GetEpisode().GetEpisodeId()] = 0
		case *gauntletv1.Event_Steps:
			seg := b.Steps.GetSteps()
			if len(seg) == 0 || len(seg) > segmentSteps {
				t.Fatalf("segment of %d steps", len(seg))
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
		case *gauntletv1.Event_Ended:
			ended++
			e := b.Ended
			if e.GetPlan() == nil || e.GetPlan().GetProfile() != e.GetProfile() {
				t.Fatalf("%s ended without its plan", e.GetEpisode().GetEpisodeId())
			}
			if e.GetSteps() != next[e.GetEpisode().GetEpisodeId()] {
				t.Fatalf("%s ended after %d steps, %d published", e.GetEpisode().GetEpisodeId(), e.GetSteps(), next[e.GetEpisode().GetEpisodeId()])
			}
		default:
			t.Fatalf("unexpected event %T", b)
		}
	}
	if started != c.episodes || ended != c.episodes || steps != c.steps {
		t.Fatalf("%d started, %d ended, %d steps; corpus says %d episodes, %d steps", started, ended, steps, c.episodes, c.steps)
	}
	total := 0
	for _, b := range c.batches(7) {
		if len(b) > 7 {
			t.Fatalf("batch of %d events, want at most 7", len(b))
		}
		total += len(b)
	}
	if total != len(c.events) {
		t.Fatalf("batches hold %d events, corpus %d", total, len(c.events))
	}
}
