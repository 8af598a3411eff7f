package faults

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/protobuf/proto"

	_ "github.com/gauntlet-rl/gauntlet/pkg/env/shop"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

func newService() *Service {
	return New(nil, noop.NewMeterProvider().Meter("test"), slog.New(slog.NewTextHandler(io.Discard, nil)))
}

func TestPlanIsDeterministicPerEpisode(t *testing.T) {
	eps := []*gauntletv1.EpisodeRequested{{EpisodeId: "a", Env: "shop", Seed: 1}, {EpisodeId: "b", Env: "shop", Seed: 2}}
	s := newService()
	r1, err := s.Plan(&gauntletv1.PlanRequest{Episodes: eps}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r2, _ := s.Plan(&gauntletv1.PlanRequest{Episodes: []*gauntletv1.EpisodeRequested{eps[1], eps[0]}}, nil)
	if !proto.Equal(r1.Plans[0], r2.Plans[1]) || !proto.Equal(r1.Plans[1], r2.Plans[0]) {
		t.Fatal("an episode's plan depends on what else is in the request")
	}
	if proto.Equal(r1.Plans[0], r1.Plans[1]) {
		t.Fatal("different seeds gave the same plan")
	}
}

func TestPlanErrorsNameTheField(t *testing.T) {
	s := newService()
	cases := []struct {
		req  *gauntletv1.PlanRequest
		want string
	}{
		{&gauntletv1.PlanRequest{Episodes: []*gauntletv1.EpisodeRequested{{Env: "shop"}, {Env: "nope"}}}, `episodes[1].env: unknown env "nope"`},
		{&gauntletv1.PlanRequest{Profiles: []*gauntletv1.Share{{Name: "chaos", Weight: 1}}}, `unknown profile "chaos"`},
		{&gauntletv1.PlanRequest{Drift: []*gauntletv1.Drift{{Selector: "*.latency.mean", Schedule: &gauntletv1.DriftSchedule{
			Points: []*gauntletv1.DriftPoint{{At: 0, Value: 1}}}}}}, `drift[0].selector: "*.latency.mean": fault latency (kind latency) has no parameter "mean"`},
	}
	for _, tc := range cases {
		if _, err := s.Plan(tc.req, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Plan error = %v, want %q", err, tc.want)
		}
	}
}
