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
