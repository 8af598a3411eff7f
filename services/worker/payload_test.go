package worker

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/play"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// bigEnv is an env whose every step answers with an observation and a state diff of size
// bytes each: over NATS's 8 MiB payload limit (huge-test), as a codefix agent that lists
// thousands of long file names, then moves them, produces; or just under the limit of a
// recorded value (large-test), so that a few steps fill a message.
type bigEnv struct {
	name string
	size int
}

const bigSteps = 3

func (e bigEnv) Spec() env.Spec {
	return env.Spec{Name: e.name, Services: []string{"svc"}, DefaultMaxSteps: bigSteps,
		Tools: []env.Tool{{Name: "svc.noop", Service: "svc", Schema: json.RawMessage(`{}`)}}}
}

func (e bigEnv) NewEpisode(env.Config) (env.Episode, error) { return &bigEpisode{size: e.size}, nil }

type bigEpisode struct{ step, size int }

func (*bigEpisode) Reset() (json.RawMessage, error) { return json.RawMessage(`{"ok":true}`), nil }

func (b *bigEpisode) Step(env.Action) (env.StepResult, error) {
	b.step++
	big := make([]byte, b.size)
	for i := range big {
		big[i] = 'a'
	}
	big[0], big[len(big)-1] = '"', '"'
	diff := append(append([]byte(`[{"op":"add","path":"`), big[1:len(big)-22]...), `"}]`...)
	return env.StepResult{Observation: big, Diff: diff, Signals: &gauntletv1.Signals{},
		Truncated: b.step >= bigSteps, Reason: gauntletv1.TerminationReason_TERMINATION_REASON_MAX_STEPS}, nil
}

func (b *bigEpisode) Now() time.Duration { return time.Duration(b.step) * time.Second }

func init() {
	env.Register(bigEnv{"huge-test", 9 << 20})
	env.Register(bigEnv{"large-test", play.MaxFieldBytes})
}

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
		if e.GetInfraError() || e.GetSteps() != bigSteps {
			t.Errorf("episode %s ended with infra error %v after %d steps, want %d steps and no infra error",
				e.GetEpisode().GetEpisodeId(), e.GetInfraError(), e.GetSteps(), bigSteps)
		}
	}
	var steps []*gauntletv1.StepTaken
	for _, m := range runEvents(t, b, r.RunId) {
		for _, ev := range m.Events() {
			steps = append(steps, ev.GetSteps().GetSteps()...)
		}
	}
	if len(steps) != 2*bigSteps {
		t.Fatalf("%d steps in the stream, want %d", len(steps), 2*bigSteps)
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
	if got := metricValue(t, tel, "gauntlet_worker_recorded_bytes_cut_total"); got < 2*bigSteps*2*(8<<20) {
		t.Errorf("gauntlet_worker_recorded_bytes_cut_total = %v, want the cut of %d values over 8 MiB", got, 2*bigSteps*2)
	}
}

// An assignment whose episodes' last segments are together over the payload limit ends in
// several batches, each under it, with every episode whole: a batch over the limit would
// never be published, and the assignment would end in infra errors.
func TestLastSegmentsOverThePayloadLimitEndInSeveralBatches(t *testing.T) {
	b, _ := startWorker(t, 2)
	r := run("rlarge")
	assign(t, b, r, "large-test", "large-test", "large-test", "large-test")
	msgs := endedMessages(t, b, r.RunId)
	if len(msgs) < 2 {
		t.Errorf("%d messages on the ended subject, want the batch cut in several", len(msgs))
	}
	var idx []uint64
	for i, m := range msgs {
		if n := proto.Size(m); n > int(b.NC.MaxPayload()) {
			t.Errorf("message %d: %d bytes, over the payload limit", i, n)
		}
		for _, ev := range m.Events() {
			end := ev.EpisodeEnd()
			if end.GetInfraError() || end.GetSteps() != bigSteps {
				t.Errorf("episode %d ended with infra error %v after %d steps", end.GetEpisode().GetIndex(), end.GetInfraError(), end.GetSteps())
			}
			idx = append(idx, end.GetEpisode().GetIndex())
		}
	}
	if !slices.Equal(idx, []uint64{0, 1, 2, 3}) {
		t.Errorf("episodes ended in order %v, want 0 to 3", idx)
	}
}
