package faults

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/templates"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// started is the service answering plan requests on an embedded NATS.
func started(ctx context.Context, t *testing.T) (*Service, *bus.Bus) {
	t.Helper()
	b := bustest.Start(t)
	s := New(func() *bus.Bus { return b }, noop.NewMeterProvider().Meter("test"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := s.Starting(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stopping(ctx) })
	return s, b
}

func askPlan(ctx context.Context, t *testing.T, b *bus.Bus, req *gauntletv1.PlanRequest) *gauntletv1.PlanReply {
	t.Helper()
	// A plan takes milliseconds; a request unanswered for 5 s was dropped.
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var reply gauntletv1.PlanReply
	if err := b.Request(rctx, bus.SubjectPlan, req, &reply); err != nil {
		t.Fatalf("no plan reply: %v", err)
	}
	return &reply
}

const slowSpec = "name: slow\nfaults:\n  - {id: latency, kind: latency, params: {mean_ms: 80, jitter_ms: 10}}\n"

// Every request the service cannot plan is answered (never dropped, so the caller does
// not wait out its timeout), with the kind that tells the caller what to do: invalid
// requests are refused for good, whatever their mistake.
func TestInvalidPlanRequestsAreAnsweredInvalid(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, b := started(ctx, t)
	eps := []*gauntletv1.EpisodeRequested{{EpisodeId: "a", Env: "shop", Seed: 1}}
	for name, req := range map[string]*gauntletv1.PlanRequest{
		"unknown env":     {Episodes: []*gauntletv1.EpisodeRequested{{EpisodeId: "a", Env: "nope", Seed: 1}}},
		"unknown profile": {Episodes: eps, Profiles: []*gauntletv1.Share{{Name: "chaos", Weight: 1}}},
		"custom profile not supplied": {Episodes: eps, Profiles: []*gauntletv1.Share{{Name: "slow", Weight: 1}},
			CustomProfiles: []*gauntletv1.CustomProfile{{Name: "fast", SpecYaml: "name: fast\nfaults: []\n"}}},
		"custom profile of unknown kind": {Episodes: eps, Profiles: []*gauntletv1.Share{{Name: "odd", Weight: 1}},
			CustomProfiles: []*gauntletv1.CustomProfile{{Name: "odd", SpecYaml: "name: odd\nfaults:\n  - {id: x, kind: gremlins}\n"}}},
		"custom profile not YAML": {Episodes: eps, Profiles: []*gauntletv1.Share{{Name: "bad", Weight: 1}},
			CustomProfiles: []*gauntletv1.CustomProfile{{Name: "bad", SpecYaml: "{{{"}}},
	} {
		r := askPlan(ctx, t, b, req)
		if r.ErrorKind != gauntletv1.ErrorKind_ERROR_KIND_INVALID || r.Error == "" || len(r.Plans) != 0 {
			t.Errorf("%s: kind %v, error %q, %d plans; want invalid", name, r.ErrorKind, r.Error, len(r.Plans))
		}
	}
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
	defer rcancel()
	msg, err := b.NC.RequestWithContext(rctx, bus.SubjectPlan, []byte("\xff\xfe not a plan request"))
	if err != nil {
		t.Fatalf("undecodable request: no answer: %v", err)
	}
	var r gauntletv1.PlanReply
	if err := proto.Unmarshal(msg.Data, &r); err != nil || r.ErrorKind != gauntletv1.ErrorKind_ERROR_KIND_INVALID {
		t.Errorf("undecodable request: %v (%v), want invalid", &r, err)
	}
}

// A plan naming a user-defined profile's template is handed out only once the template
// is where a worker in another process finds it: expanded there, it is exactly the plan
// the profile defines. When the templates bucket cannot be written, the request is
// unavailable (retried), not invalid.
func TestCustomProfilePlansFindTheirTemplate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, b := started(ctx, t)
	req := &gauntletv1.PlanRequest{
		Profiles:       []*gauntletv1.Share{{Name: "slow", Weight: 1}},
		CustomProfiles: []*gauntletv1.CustomProfile{{Name: "slow", SpecYaml: slowSpec}},
		Episodes:       []*gauntletv1.EpisodeRequested{{EpisodeId: "a", Env: "shop", Seed: 11}, {EpisodeId: "b", Env: "shop", Seed: 12}},
	}
	reply := askPlan(ctx, t, b, req)
	if reply.Error != "" || len(reply.Plans) != 2 {
		t.Fatalf("plan: %v", reply)
	}
	local, tmpls, err := s.Plan(req, nil)
	if err != nil {
		t.Fatal(err)
	}
	svcs := []string{"catalog", "inventory", "orders", "payment", "shipping"}
	worker := templates.NewClient(b.JS)
	for i, p := range reply.Plans {
		if p.Profile != "slow" || p.Template == "" {
			t.Fatalf("plan %d: profile %q template %q", i, p.Profile, p.Template)
		}
		got, err := worker.Expand(ctx, p, svcs)
		if err != nil {
			t.Fatalf("plan %d: a worker cannot expand it: %v", i, err)
		}
		want, err := plans.Expand(local.Plans[i], svcs, tmpls[local.Plans[i].Template])
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got, want) {
			t.Errorf("plan %d: a worker expands %v, want %v", i, got, want)
		}
	}

	if err := b.JS.DeleteKeyValue(ctx, bus.BucketPlanTemplates); err != nil {
		t.Fatal(err)
	}
	req.CustomProfiles[0].SpecYaml = "name: slow\nfaults:\n  - {id: latency, kind: latency, params: {mean_ms: 90, jitter_ms: 10}}\n"
	if r := askPlan(ctx, t, b, req); r.ErrorKind != gauntletv1.ErrorKind_ERROR_KIND_UNAVAILABLE || len(r.Plans) != 0 {
		t.Errorf("templates bucket gone: kind %v (%q), %d plans; want unavailable and no plan", r.ErrorKind, r.Error, len(r.Plans))
	}
}

// The global drift set in the KV bucket reaches every plan the service hands out,
// recorded as global, and a run's drift for the same selector is recorded after it.
func TestGlobalDriftReachesPlans(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, b := started(ctx, t)
	sched := func(v float64) *gauntletv1.DriftSchedule {
		return &gauntletv1.DriftSchedule{Shape: gauntletv1.DriftShape_DRIFT_SHAPE_STEP, Points: []*gauntletv1.DriftPoint{{At: 0, Value: v}}}
	}
	if _, err := SetGlobalDrift(ctx, b.JS, &gauntletv1.DriftSet{Drift: []*gauntletv1.Drift{{Selector: "*.latency.mean_ms", Schedule: sched(300)}}, SetBy: t.Name()}); err != nil {
		t.Fatal(err)
	}
	r := askPlan(ctx, t, b, &gauntletv1.PlanRequest{
		Episodes: []*gauntletv1.EpisodeRequested{{EpisodeId: "a", Env: "shop", Seed: 1}},
		Drift:    []*gauntletv1.Drift{{Selector: "*.latency.mean_ms", Schedule: sched(500)}},
	})
	if r.Error != "" || len(r.Plans) != 1 {
		t.Fatalf("plan: %v", r)
	}
	want := []*gauntletv1.DriftValue{
		{Selector: "*.latency.mean_ms", Value: 300, Source: plans.DriftSourceGlobal},
		{Selector: "*.latency.mean_ms", Value: 500, Source: plans.DriftSourceRun},
	}
	got := r.Plans[0].DriftValues
	if len(got) != len(want) {
		t.Fatalf("drift values %v, want %v", got, want)
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("drift value %d: %v, want %v", i, got[i], want[i])
		}
	}
}
