package reward

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/protobuf/proto"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

func newService() *Service {
	return New(Config{}, nil, noop.NewMeterProvider().Meter("test"), slog.New(slog.NewTextHandler(io.Discard, nil)))
}

func TestScoreKeepsOrderAndNamesComponents(t *testing.T) {
	req := &gauntletv1.ScoreRequest{Steps: []*gauntletv1.StepTaken{
		{EpisodeId: "r1-0000000", Step: 0, Env: "shop", Signals: &gauntletv1.Signals{ProgressDelta: 0.2}, Metering: &gauntletv1.Metering{ToolCalls: 1}},
		{EpisodeId: "r1-0000000", Step: 1, Env: "shop", Signals: &gauntletv1.Signals{InvalidAction: true}},
	}}
	data, _ := proto.Marshal(req)
	reply := newService().Score(data)
	scores, err := reply.StepScores(req.Steps)
	if err != nil {
		t.Fatalf("reply = %v: %v", reply, err)
	}
	if scores[0].Step != 0 || scores[1].Step != 1 {
		t.Fatalf("scores out of order: %v", scores)
	}
	if scores[0].Total <= scores[1].Total {
		t.Fatalf("progress scored %v, an invalid action %v: want progress higher", scores[0].Total, scores[1].Total)
	}
	names := []string{}
	for _, c := range scores[0].Components {
		names = append(names, c.Name)
	}
	if got := strings.Join(names, ","); got != "task,cost,safety,timeliness,causal" {
		t.Fatalf("components = %s", got)
	}
}

func TestScoreRefusesGarbage(t *testing.T) {
	reply := newService().Score([]byte("\xff\xfe"))
	if !strings.Contains(reply.Error, "decode score request") || reply.ErrorKind != gauntletv1.ErrorKind_ERROR_KIND_INVALID || reply.Table != nil {
		t.Fatalf("reply = %v", reply)
	}
}

// A request whose per-step fields do not fit its steps is refused with the field named,
// before any spec is read or step scored.
func TestScoreRefusesMisfitRequests(t *testing.T) {
	steps := func() []*gauntletv1.StepTaken {
		return []*gauntletv1.StepTaken{{EpisodeId: "r1-0000000", Env: "shop"}, {EpisodeId: "r1-0000001", Env: "shop"}}
	}
	for _, tc := range []struct {
		name string
		req  *gauntletv1.ScoreRequest
		want string
	}{
		{"states", &gauntletv1.ScoreRequest{Steps: steps(), States: []*gauntletv1.RewardState{{}}}, "states: 1 for 2 steps"},
		{"encoded_states", &gauntletv1.ScoreRequest{Steps: steps(), EncodedStates: [][]byte{nil, nil, nil}}, "encoded_states: 3 for 2 steps"},
		{"both", &gauntletv1.ScoreRequest{Steps: steps(), States: []*gauntletv1.RewardState{{}, {}}, EncodedStates: [][]byte{nil, nil}}, "one or the other"},
		{"spec_of length", &gauntletv1.ScoreRequest{Steps: steps(), SpecDigests: []string{"sha256:ab"}, SpecOf: []uint32{1}}, "spec_of: 1 for 2 steps"},
		{"spec_of index", &gauntletv1.ScoreRequest{Steps: steps(), SpecDigests: []string{"sha256:ab"}, SpecOf: []uint32{0, 2}}, "spec_of[1]: 2, past the 1 spec_digests"},
		{"bad state", &gauntletv1.ScoreRequest{Steps: steps(), EncodedStates: [][]byte{nil, {0x48, 0x01}}}, ""},
	} {
		data, _ := proto.Marshal(tc.req)
		reply := newService().Score(data)
		if tc.want == "" { // default-spec steps: their states are not read
			if reply.Error != "" || len(reply.GetTable().GetEncodedStates()) != 2 {
				t.Errorf("%s: reply %v, want the steps scored and their states given back", tc.name, reply)
			}
			continue
		}
		if !strings.Contains(reply.Error, tc.want) || reply.ErrorKind != gauntletv1.ErrorKind_ERROR_KIND_INVALID || reply.Table != nil {
			t.Errorf("%s: reply %v, want an invalid-request error with %q", tc.name, reply, tc.want)
		}
	}
}
