package worker

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/play"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// hugeEnv is an env whose every step answers with a 9 MiB observation and a 9 MiB state
// diff, each alone over NATS's 8 MiB payload limit, as a codefix agent that lists
// thousands of long file names, then moves them, produces.
type hugeEnv struct{}

const hugeSteps = 3

func (hugeEnv) Spec() env.Spec {
	return env.Spec{Name: "huge-test", Services: []string{"svc"}, DefaultMaxSteps: hugeSteps,
		Tools: []env.Tool{{Name: "svc.noop", Service: "svc", Schema: json.RawMessage(`{}`)}}}
}

func (hugeEnv) NewEpisode(env.Config) (env.Episode, error) { return &hugeEpisode{}, nil }

type hugeEpisode struct{ step int }

func (*hugeEpisode) Reset() (json.RawMessage, error) { return json.RawMessage(`{"ok":true}`), nil }

func (h *hugeEpisode) Step(env.Action) (env.StepResult, error) {
	h.step++
	big := make([]byte, 9<<20)
	for i := range big {
		big[i] = 'a'
	}
	big[0], big[len(big)-1] = '"', '"'
	diff := append(append([]byte(`[{"op":"add","path":"`), big[1:len(big)-1]...), `"}]`...)
	return env.StepResult{Observation: big, Diff: diff, Signals: &gauntletv1.Signals{},
		Truncated: h.step >= hugeSteps, Reason: gauntletv1.TerminationReason_TERMINATION_REASON_MAX_STEPS}, nil
}

func (h *hugeEpisode) Now() time.Duration { return time.Duration(h.step) * time.Second }

func init() { env.Register(hugeEnv{}) }

// An episode whose steps produce values over the stream's payload limit is recorded
// whole: every step in the stream, the oversized values cut to a marked prefix that is
// still JSON, no infra error, and the cut bytes counted.
func TestOversizedStepsAreRecordedTruncated(t *testing.T) {
	b, tel := startWorker(t, 2)
	r := run("rhuge")
	assign(t, b, r, "huge-test", "huge-test")
	msgs := endedMessages(t, b, r.RunId)
	var ends []*gauntletv1.EpisodeEnded
	for _, m := range msgs {
		for _, ev := range m.Events() {
			if e := ev.EpisodeEnd(); e != nil {
				ends = append(ends, e)
			}
		}
	}
	if len(ends) != 2 {
		t.Fatalf("%d episode ends on the ended subject, want 2", len(ends))
	}
	for _, e := range ends {
		if e.GetInfraError() || e.GetSteps() != hugeSteps {
			t.Errorf("episode %s ended with infra error %v after %d steps, want %d steps and no infra error",
				e.GetEpisode().GetEpisodeId(), e.GetInfraError(), e.GetSteps(), hugeSteps)
		}
	}
	var steps []*gauntletv1.StepTaken
	for _, m := range runEvents(t, b, r.RunId) {
		for _, ev := range m.Events() {
			steps = append(steps, ev.GetSteps().GetSteps()...)
		}
	}
	if len(steps) != 2*hugeSteps {
		t.Fatalf("%d steps in the stream, want %d", len(steps), 2*hugeSteps)
	}
	for _, st := range steps {
		// A state diff stays a JSON array of changes: the marker is its one element.
		diff, isArray := strings.CutPrefix(st.StateDiffJson, "[")
		diff, _ = strings.CutSuffix(diff, "]")
		for name, v := range map[string]string{"observation": st.ObservationJson, "state diff": diff} {
			if !isArray || len(v) > play.MaxFieldBytes || !json.Valid([]byte(v)) || !strings.HasPrefix(v, `{"gauntlet_truncated"`) {
				t.Errorf("step %d: %s of %d bytes is not a marked JSON prefix within %d bytes: %.80s", st.Step, name, len(v), play.MaxFieldBytes, v)
				continue
			}
			var cut play.Cut
			if err := json.Unmarshal([]byte(v), &cut); err != nil {
				t.Fatal(err)
			}
			if cut.Truncated.OriginalBytes < 9<<20 || cut.Truncated.CutBytes != cut.Truncated.OriginalBytes-len(cut.Truncated.Prefix) ||
				!bytes.Contains([]byte(cut.Truncated.Prefix), []byte("aaaa")) {
				t.Errorf("step %d: %s marker %+v", st.Step, name, cut.Truncated.OriginalBytes)
			}
		}
	}
	if got := metricValue(t, tel, "gauntlet_worker_recorded_bytes_cut_total"); got < 2*hugeSteps*2*(8<<20) {
		t.Errorf("gauntlet_worker_recorded_bytes_cut_total = %v, want the cut of %d values over 8 MiB", got, 2*hugeSteps*2)
	}
}
