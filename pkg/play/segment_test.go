package play

import (
	"testing"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

func TestSegmenter(t *testing.T) {
	req := &gauntletv1.EpisodeRequested{EpisodeId: "e1", RunId: "r1"}
	step := func(i uint32) *gauntletv1.StepTaken {
		return &gauntletv1.StepTaken{EpisodeId: "e1", RunId: "r1", Step: i}
	}
	cases := []struct {
		name  string
		steps uint32
		max   int
		flush []uint32 // Flush after these steps
		want  [][3]int // per segment: steps, has start (0/1), has end (0/1)
	}{
		{"short episode is one message", 7, 32, nil, [][3]int{{7, 1, 1}}},
		{"no steps: start and end together", 0, 32, nil, [][3]int{{0, 1, 1}}},
		{"full segments, end with the rest", 70, 32, nil, [][3]int{{32, 1, 0}, {32, 0, 0}, {6, 0, 1}}},
		{"exact multiple: end alone", 64, 32, nil, [][3]int{{32, 1, 0}, {32, 0, 0}, {0, 0, 1}}},
		{"flush mid-episode", 5, 32, []uint32{2}, [][3]int{{2, 1, 0}, {3, 0, 1}}},
		{"flush with nothing queued emits nothing", 3, 32, []uint32{0}, [][3]int{{3, 1, 1}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got []*gauntletv1.StepsTaken
			g := Segmenter{Max: c.max, Emit: func(ev *gauntletv1.Event) error {
				got = append(got, ev.GetSteps())
				return nil
			}}
			g.Start(&gauntletv1.EpisodeStarted{Episode: req})
			flushAt := map[uint32]bool{}
			for _, f := range c.flush {
				flushAt[f] = true
			}
			if flushAt[0] {
				if err := g.Flush(); err != nil {
					t.Fatal(err)
				}
			}
			for i := uint32(0); i < c.steps; i++ {
				if err := g.Step(step(i)); err != nil {
					t.Fatal(err)
				}
				if flushAt[i+1] {
					if err := g.Flush(); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := g.End(&gauntletv1.EpisodeEnded{Episode: req, Steps: c.steps}); err != nil {
				t.Fatal(err)
			}
			if len(got) != len(c.want) {
				t.Fatalf("%d segments, want %d", len(got), len(c.want))
			}
			next := uint32(0)
			for i, seg := range got {
				w := c.want[i]
				if len(seg.GetSteps()) != w[0] || (seg.GetStarted() != nil) != (w[1] == 1) || (seg.GetEnded() != nil) != (w[2] == 1) {
					t.Errorf("segment %d: %d steps, start %v, end %v; want %v", i, len(seg.GetSteps()), seg.GetStarted() != nil, seg.GetEnded() != nil, w)
				}
				for _, st := range seg.GetSteps() {
					if st.GetStep() != next {
						t.Fatalf("segment %d: step %d, want %d", i, st.GetStep(), next)
					}
					next++
				}
			}
			if next != c.steps {
				t.Fatalf("%d steps emitted, want %d", next, c.steps)
			}
		})
	}
}
