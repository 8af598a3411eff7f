package play

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

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
		// terminal marks the last step as the episode's end (truncated), as a session's
		// last step is; waited makes every step find the segment a second old.
		terminal, waited bool
	}{
		{"short episode is one message", 7, 32, nil, [][3]int{{7, 1, 1}}, false, false},
		{"no steps: start and end together", 0, 32, nil, [][3]int{{0, 1, 1}}, false, false},
		{"full segments, end with the rest", 70, 32, nil, [][3]int{{32, 1, 0}, {32, 0, 0}, {6, 0, 1}}, false, false},
		{"exact multiple: end alone", 64, 32, nil, [][3]int{{32, 1, 0}, {32, 0, 0}, {0, 0, 1}}, false, false},
		{"flush mid-episode", 5, 32, []uint32{2}, [][3]int{{2, 1, 0}, {3, 0, 1}}, false, false},
		{"flush with nothing queued emits nothing", 3, 32, []uint32{0}, [][3]int{{3, 1, 1}}, false, false},
		// The end follows a terminal step at once: it goes with it, not in a message of
		// its own, whether the segment is full or has waited.
		{"exact multiple, last step terminal: end with it", 64, 32, nil, [][3]int{{32, 1, 0}, {32, 0, 1}}, true, false},
		{"waited a second: each step alone, the terminal one with the end", 3, 32, nil, [][3]int{{1, 1, 0}, {1, 0, 0}, {1, 0, 1}}, true, true},
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
				st := step(i)
				st.Truncated = c.terminal && i == c.steps-1
				if c.waited {
					g.lastFlush = time.Now().Add(-2 * time.Second)
				}
				if err := g.Step(st); err != nil {
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

// Steps at every recorded value's limit are cut into segments that each fit the stream's
// payload limit with their episode's end; normal steps are cut by count alone.
func TestSegmenterCutsBySize(t *testing.T) {
	const maxPayload = 8 << 20
	big := func(b byte) string { return strings.Repeat(string(b), MaxFieldBytes) }
	req := &gauntletv1.EpisodeRequested{EpisodeId: "e1", RunId: "r1"}
	for _, c := range []struct {
		name     string
		step     func(i uint32) *gauntletv1.StepTaken
		segments int
	}{
		{"values at their limits", func(i uint32) *gauntletv1.StepTaken {
			return &gauntletv1.StepTaken{EpisodeId: "e1", Step: i, Action: &gauntletv1.Action{Tool: "t", ArgsJson: big('a')},
				ObservationJson: big('o'), StateDiffJson: big('d'),
				Trainer: &gauntletv1.TrainerData{PromptTokenIds: slices.Repeat([]uint32{1 << 31}, MaxTrainerTokens/2),
					CompletionTokenIds: slices.Repeat([]uint32{1 << 31}, MaxTrainerTokens/2), Logprobs: slices.Repeat([]float32{-1}, MaxTrainerTokens/2)}}
		}, 5},
		{"normal steps", func(i uint32) *gauntletv1.StepTaken {
			return &gauntletv1.StepTaken{EpisodeId: "e1", Step: i, ObservationJson: `{"ok":true}`}
		}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got []*gauntletv1.Event
			g := Segmenter{Max: 32, MaxBytes: SegmentBytes(maxPayload), Emit: func(ev *gauntletv1.Event) error {
				got = append(got, ev)
				return nil
			}}
			g.Start(&gauntletv1.EpisodeStarted{Episode: req, ObservationJson: big('s')})
			for i := range uint32(5) {
				if err := g.Step(c.step(i)); err != nil {
					t.Fatal(err)
				}
			}
			plan := &gauntletv1.FaultPlan{Profile: "stress", Seed: 1}
			if err := g.End(&gauntletv1.EpisodeEnded{Episode: req, Steps: 5, Plan: plan}); err != nil {
				t.Fatal(err)
			}
			if len(got) != c.segments {
				t.Errorf("%d segments, want %d", len(got), c.segments)
			}
			for i, ev := range got {
				if n := proto.Size(ev); n > maxPayload-64<<10 {
					t.Errorf("segment %d: %d bytes, over the payload limit less headroom", i, n)
				}
			}
		})
	}
}

// A value over MaxFieldBytes is recorded as a marked prefix, still JSON, under the limit,
// cut at a character boundary and saying how much was left out; a diff stays an array.
func TestCutValue(t *testing.T) {
	v := []byte(`"` + strings.Repeat("é", MaxFieldBytes) + `"`) // 2 bytes a character
	for _, inArray := range []bool{false, true} {
		rec, cut := cutValue(v, inArray)
		if len(rec) > MaxFieldBytes || !json.Valid(rec) {
			t.Fatalf("marker of %d bytes, valid JSON %v", len(rec), json.Valid(rec))
		}
		var c Cut
		body := rec
		if inArray {
			var arr []json.RawMessage
			if err := json.Unmarshal(rec, &arr); err != nil || len(arr) != 1 {
				t.Fatalf("diff marker %.40s is not a one-element array: %v", rec, err)
			}
			body = arr[0]
		}
		if err := json.Unmarshal(body, &c); err != nil {
			t.Fatal(err)
		}
		p := c.Truncated.Prefix
		if !utf8.ValidString(p) || c.Truncated.OriginalBytes != len(v) || cut != len(v)-len(p) || c.Truncated.CutBytes != cut || !strings.HasPrefix(string(v), p) {
			t.Errorf("marker %d bytes of %d, cut %d (said %d), prefix valid UTF-8 %v", len(p), c.Truncated.OriginalBytes, cut, c.Truncated.CutBytes, utf8.ValidString(p))
		}
	}
	// Bytes that escape to six characters each still fit.
	ctl := make([]byte, MaxFieldBytes+1)
	if rec, _ := cutValue(ctl, false); len(rec) > MaxFieldBytes || !json.Valid(rec) {
		t.Errorf("marker of control bytes: %d bytes, valid JSON %v", len(rec), json.Valid(rec))
	}
}
