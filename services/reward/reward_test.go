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
	if reply.Error != "" || len(reply.Scores) != 2 {
		t.Fatalf("reply = %v", reply)
	}
	if reply.Scores[0].Step != 0 || reply.Scores[1].Step != 1 {
		t.Fatalf("scores out of order: %v", reply.Scores)
	}
	if reply.Scores[0].Total <= reply.Scores[1].Total {
		t.Fatalf("progress scored %v, an invalid action %v: want progress higher", reply.Scores[0].Total, reply.Scores[1].Total)
	}
	names := []string{}
	for _, c := range reply.Scores[0].Components {
		names = append(names, c.Name)
	}
	if got := strings.Join(names, ","); got != "task,cost,safety,timeliness,causal" {
		t.Fatalf("components = %s", got)
	}
}

func TestScoreRefusesGarbage(t *testing.T) {
	reply := newService().Score([]byte("\xff\xfe"))
	if !strings.Contains(reply.Error, "decode score request") || len(reply.Scores) != 0 {
		t.Fatalf("reply = %v", reply)
	}
}
