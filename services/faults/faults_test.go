package faults

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
	_ "github.com/gauntlet-rl/gauntlet/pkg/env/shop"
	"github.com/gauntlet-rl/gauntlet/pkg/errkind"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

func newService() *Service {
	return New(nil, noop.NewMeterProvider().Meter("test"), slog.New(slog.NewTextHandler(io.Discard, nil)))
}

func TestPlanIsDeterministicPerEpisode(t *testing.T) {
	eps := []*gauntletv1.EpisodeRequested{{EpisodeId: "a", Env: "shop", Seed: 1}, {EpisodeId: "b", Env: "shop", Seed: 2}}
	s := newService()
	r1, _, err := s.Plan(&gauntletv1.PlanRequest{Episodes: eps}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r2, _, _ := s.Plan(&gauntletv1.PlanRequest{Episodes: []*gauntletv1.EpisodeRequested{eps[1], eps[0]}}, nil)
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
		if _, _, err := s.Plan(tc.req, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Plan error = %v, want %q", err, tc.want)
		}
	}
}

// The service hands out compact plans; expanded with the templates it returns, each is
// exactly the plan pkg/faults/plans derives for the episode's seed, profile and drift.
func TestPlansAreCompactAndExpandExactly(t *testing.T) {
	const spec = "name: slow\nfaults:\n  - {id: latency, kind: latency, params: {mean_ms: 80, jitter_ms: 10}}\n"
	req := &gauntletv1.PlanRequest{
		Profiles:       []*gauntletv1.Share{{Name: "slow", Weight: 1}, {Name: plans.ProfileEdge, Weight: 1}},
		CustomProfiles: []*gauntletv1.CustomProfile{{Name: "slow", SpecYaml: spec}},
		Drift: []*gauntletv1.Drift{{Selector: "*.latency.mean_ms", Schedule: &gauntletv1.DriftSchedule{
			Shape: gauntletv1.DriftShape_DRIFT_SHAPE_LINEAR, Points: []*gauntletv1.DriftPoint{{At: 0, Value: 10}, {At: 100, Value: 210}}}}},
	}
	for i := range 40 {
		req.Episodes = append(req.Episodes, &gauntletv1.EpisodeRequested{EpisodeId: fmt.Sprint(i), Env: "shop", Seed: uint64(1000 + i), Index: uint64(i)})
	}
	reply, tmpls, err := newService().Plan(req, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(tmpls) != 1 {
		t.Fatalf("%d templates for one user-defined profile", len(tmpls))
	}
	custom, err := plans.CompileCustomProfiles(req.CustomProfiles)
	if err != nil {
		t.Fatal(err)
	}
	svcs := []string{"catalog", "inventory", "orders", "payment", "shipping"}
	seen := map[string]int{}
	for i, c := range reply.Plans {
		if !c.Compact || len(c.Rules) > 0 {
			t.Fatalf("plan %d is not compact: %v", i, c)
		}
		got, err := plans.Expand(c, svcs, tmpls[c.Template])
		if err != nil {
			t.Fatalf("plan %d: %v", i, err)
		}
		ep := req.Episodes[i]
		var want *gauntletv1.FaultPlan
		if c.Profile == "slow" {
			want, err = custom.Plan(rng.Derive(ep.Seed, "faults"), "slow", svcs)
		} else {
			want, err = plans.Derive(rng.Derive(ep.Seed, "faults"), c.Profile, svcs)
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := plans.ApplyDrift(want, plans.DriftValues(req.Drift, plans.EpisodePosition(ep), plans.DriftSourceRun)); err != nil {
			t.Fatal(err)
		}
		if c.Digest != "" {
			t.Fatalf("plan %d: the service derived a digest; the player seals it", i)
		}
		if want.Digest, err = plans.Digest(want); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got, want) {
			t.Fatalf("plan %d expanded to\n%v\nwant\n%v", i, got, want)
		}
		seen[c.Profile]++
	}
	if seen["slow"] == 0 || seen[plans.ProfileEdge] == 0 {
		t.Fatalf("profiles drawn %v; the test needs both", seen)
	}
}

// A run's drift may name a user-defined profile's fault by its id: the expanded plans of
// that profile carry the drifted value, and the run's plans of a built-in profile record
// it and change nothing.
func TestRunDriftReachesUserDefinedFaults(t *testing.T) {
	const spec = "name: slow\nfaults:\n  - {id: slow-lat, kind: latency, params: {mean_ms: 80, jitter_ms: 10}}\n"
	req := &gauntletv1.PlanRequest{
		Profiles:       []*gauntletv1.Share{{Name: "slow", Weight: 1}, {Name: plans.ProfileBaseline, Weight: 1}},
		CustomProfiles: []*gauntletv1.CustomProfile{{Name: "slow", SpecYaml: spec}},
		Drift: []*gauntletv1.Drift{{Selector: "payment.slow-lat.mean_ms", Schedule: &gauntletv1.DriftSchedule{
			Shape: gauntletv1.DriftShape_DRIFT_SHAPE_STEP, Points: []*gauntletv1.DriftPoint{{At: 0, Value: 700}}}}},
	}
	for i := range 20 {
		req.Episodes = append(req.Episodes, &gauntletv1.EpisodeRequested{EpisodeId: fmt.Sprint(i), Env: "shop", Seed: uint64(50 + i), Index: uint64(i)})
	}
	reply, tmpls, err := newService().Plan(req, nil)
	if err != nil {
		t.Fatal(err)
	}
	svcs := []string{"catalog", "inventory", "orders", "payment", "shipping"}
	seen := map[string]int{}
	for i, c := range reply.Plans {
		got, err := plans.Expand(c, svcs, tmpls[c.Template])
		if err != nil {
			t.Fatalf("plan %d: %v", i, err)
		}
		seen[c.Profile]++
		if len(got.DriftValues) != 1 || got.DriftValues[0].Value != 700 {
			t.Fatalf("plan %d: drift values %v", i, got.DriftValues)
		}
		for _, r := range got.Rules {
			m := r.GetLatency().GetMeanMs()
			switch {
			case c.Profile == "slow" && r.Id == "payment.slow-lat" && m != 700,
				c.Profile == "slow" && r.Id != "payment.slow-lat" && m != 80,
				c.Profile != "slow" && m >= 700:
				t.Errorf("plan %d (%s): rule %s mean_ms %v", i, c.Profile, r.Id, m)
			}
		}
	}
	if seen["slow"] == 0 || seen[plans.ProfileBaseline] == 0 {
		t.Fatalf("profiles drawn %v; the test needs both", seen)
	}
}

// A plan reply's error says its kind: a request that cannot be planned is invalid (the
// caller refuses the run), a bucket that cannot be read is unavailable (the caller tries
// again later).
func TestPlanReplyErrorsCarryTheirKind(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := bustest.Start(t)
	s := New(func() *bus.Bus { return b }, noop.NewMeterProvider().Meter("test"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := s.Starting(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Stopping(ctx)
	ask := func(req *gauntletv1.PlanRequest) *gauntletv1.PlanReply {
		t.Helper()
		var reply gauntletv1.PlanReply
		if err := b.Request(ctx, bus.SubjectPlan, req, &reply); err != nil {
			t.Fatal(err)
		}
		return &reply
	}
	eps := []*gauntletv1.EpisodeRequested{{EpisodeId: "a", Env: "shop", Seed: 1}}
	if r := ask(&gauntletv1.PlanRequest{Episodes: eps}); r.Error != "" || r.ErrorKind != gauntletv1.ErrorKind_ERROR_KIND_UNSPECIFIED || len(r.Plans) != 1 {
		t.Fatalf("valid request: %v", r)
	}
	if r := ask(&gauntletv1.PlanRequest{Episodes: eps, Profiles: []*gauntletv1.Share{{Name: "chaos", Weight: 1}}}); r.ErrorKind != gauntletv1.ErrorKind_ERROR_KIND_INVALID {
		t.Errorf("unknown profile: kind %v (%q), want invalid", r.ErrorKind, r.Error)
	}
	if err := b.JS.DeleteKeyValue(ctx, bus.BucketDrift); err != nil {
		t.Fatal(err)
	}
	if r := ask(&gauntletv1.PlanRequest{Episodes: eps}); r.ErrorKind != gauntletv1.ErrorKind_ERROR_KIND_UNAVAILABLE || r.Error == "" {
		t.Errorf("drift bucket unreadable: kind %v (%q), want unavailable", r.ErrorKind, r.Error)
	}
}

// A read of the global drift that times out is unavailable, not the request's fault.
func TestGlobalDriftTimeoutIsUnavailable(t *testing.T) {
	b := bustest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	_, _, err := GlobalDrift(ctx, b.JS)
	if !errors.Is(err, context.DeadlineExceeded) || !errkind.Is(errkind.Unavailable, err) {
		t.Fatalf("GlobalDrift past its deadline: %v (kind %v), want a deadline exceeded of kind unavailable", err, errkind.Of(err))
	}
}
