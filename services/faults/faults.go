// Package faults is the fault-injector service: it owns the catalogue and turns an
// episode request into the fault plan the episode will meet. The scheduler asks for plans
// in batches over NATS request/reply before assigning episodes, so every plan is fixed
// before a worker sees the episode, and replay meets the same faults.
//
// Plans are pkg/faults/plans's pure functions of (seed, profile, env services); the service
// fixes their inputs and hands them out by reference (pkg/faults/plans.Expand derives the rules
// where the episode is played): the profile drawn from the mix, request validation, drift
// (the run's schedules from the request and the global ones from the gauntlet_drift KV
// bucket, read once per batch), the templates of user-defined profiles, and metrics.
// Handlers run on NATS subscription goroutines; the service holds no mutable state.
package faults

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/metric"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/errkind"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	"github.com/gauntlet-rl/gauntlet/pkg/telemetry"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// QueueGroup is the NATS queue group fault services share.
const QueueGroup = "faults"

// Service is the fault-injector service.
type Service struct {
	bus     func() *bus.Bus
	log     *slog.Logger
	sub     *nats.Subscription
	planned metric.Int64Counter
	// templates puts user-defined profiles' plan templates where workers find them (set
	// by Starting).
	templates *templateWriter
}

// New allocates the service.
func New(getBus func() *bus.Bus, meter metric.Meter, log *slog.Logger) *Service {
	return &Service{
		bus: getBus, log: log,
		planned: telemetry.Must(meter.Int64Counter("gauntlet_faults_plans_total", metric.WithDescription("Fault plans derived."))),
	}
}

// Starting subscribes to the plan subject.
func (s *Service) Starting(ctx context.Context) error {
	nc := s.bus().NC
	s.templates = newTemplateWriter(s.bus().JS)
	sub, err := nc.QueueSubscribe(bus.SubjectPlan, QueueGroup, s.handle)
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", bus.SubjectPlan, err)
	}
	s.sub = sub
	return nc.FlushTimeout(10 * time.Second)
}

// Running waits for the stop.
func (s *Service) Running(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

// Stopping drains the subscription.
func (s *Service) Stopping(context.Context) error {
	if s.sub != nil {
		_ = s.sub.Drain()
	}
	return nil
}

func (s *Service) handle(m *nats.Msg) {
	reply, err := s.answer(m.Data)
	if err != nil {
		reply = &gauntletv1.PlanReply{}
		reply.Error, reply.ErrorKind = errkind.Reply(err)
		if errkind.Is(errkind.Unavailable, err) {
			s.log.Warn("cannot plan now; the caller retries", "err", err)
		}
	}
	data, err := gauntletv1.Marshal(reply)
	if err != nil {
		s.log.Error("marshal plan reply", "err", err)
		return
	}
	if err := m.Respond(data); err != nil {
		s.log.Warn("respond to plan request", "err", err)
	}
}

// answer plans one encoded PlanRequest. Its errors carry their kind: a request that
// cannot be planned is errkind.Invalid; a KV bucket that failed or timed out (the global
// drift, the templates) is errkind.Unavailable, for the caller to retry.
func (s *Service) answer(data []byte) (*gauntletv1.PlanReply, error) {
	var req gauntletv1.PlanRequest
	if err := gauntletv1.Unmarshal(data, &req); err != nil {
		return nil, errkind.E(errkind.Invalid, fmt.Errorf("decode plan request: %w", err))
	}
	// One read of the global drift per batch: every episode of the batch, and every
	// planner answering at the same moment, applies the same value.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	global, _, err := GlobalDrift(ctx, s.bus().JS)
	if err != nil {
		return nil, err
	}
	reply, tmpls, err := s.Plan(&req, global.GetDrift())
	if err != nil {
		return nil, err
	}
	// Every template a plan names is findable before any worker sees the plan.
	for id, t := range tmpls {
		if err := s.templates.Put(ctx, id, t); err != nil {
			return nil, errkind.E(errkind.Unavailable, err)
		}
	}
	return reply, nil
}

// Plan fixes the plan of every episode in the request, in order, and returns them compact
// (their inputs and, for a user-defined profile, a template id; pkg/faults/plans.Expand
// derives the rules, and the digest, where the episode is played) with the templates they
// name, by id, which the caller must make findable (answer puts them in the templates
// bucket) before it hands the plans out. The profile of an episode is drawn from the mix with the episode's seed, so
// it is as reproducible as the plan itself. The mix may name the run's user-defined
// profiles (req.custom_profiles), whose rules come from their YAML specs, the same for
// every episode of the profile: the template. Drift is applied on top: first the
// global schedules, then the run's (req.drift), each evaluated at the episode's index or
// requested time, so a run's value overrides a global one for the same selector. The
// values in force are recorded on the plan. Drift changes numbers only: the plan's seed
// and rule ids, hence every random draw, stay what they are without drift.
//
// Its errors are the request's: errkind.Invalid.
func (s *Service) Plan(req *gauntletv1.PlanRequest, global []*gauntletv1.Drift) (*gauntletv1.PlanReply, map[string]*gauntletv1.FaultPlan, error) {
	reply, used, err := s.plan(req, global)
	return reply, used, errkind.E(errkind.Invalid, err)
}

func (s *Service) plan(req *gauntletv1.PlanRequest, global []*gauntletv1.Drift) (*gauntletv1.PlanReply, map[string]*gauntletv1.FaultPlan, error) {
	custom, err := plans.CompileCustomProfiles(req.GetCustomProfiles())
	if err != nil {
		return nil, nil, err
	}
	mix := req.GetProfiles()
	if len(mix) == 0 {
		mix = plans.DefaultMix()
	}
	if err := plans.ValidateMix(mix, custom.Names()...); err != nil {
		return nil, nil, err
	}
	if err := plans.ValidateDriftFor(req.GetDrift(), custom); err != nil {
		return nil, nil, err
	}
	if err := plans.ValidateDrift(global); err != nil {
		return nil, nil, fmt.Errorf("global %w", err)
	}
	reply := &gauntletv1.PlanReply{Plans: make([]*gauntletv1.FaultPlan, len(req.Episodes))}
	services := map[string][]string{}
	type template struct {
		id   string
		plan *gauntletv1.FaultPlan
	}
	byProfile := map[[2]string]template{} // (env, profile) → template, of the episodes' profiles
	for i, ep := range req.Episodes {
		svcs, ok := services[ep.Env]
		if !ok {
			e, err := env.Lookup(ep.Env)
			if err != nil {
				return nil, nil, fmt.Errorf("episodes[%d].env: %w", i, err)
			}
			svcs = e.Spec().Services
			services[ep.Env] = svcs
		}
		profile, err := plans.ChooseProfile(rng.Derive(ep.Seed, "profile"), mix, custom.Names()...)
		if err != nil {
			return nil, nil, fmt.Errorf("episodes[%d]: choose profile: %w", i, err)
		}
		ref := &gauntletv1.FaultPlan{Profile: profile, Seed: rng.Derive(ep.Seed, "faults"),
			CatalogueVersion: plans.CatalogueVersion, Compact: true}
		if _, own := custom[profile]; own {
			t, ok := byProfile[[2]string{ep.Env, profile}]
			if !ok {
				full, err := custom.Plan(0, profile, svcs)
				if err != nil {
					return nil, nil, fmt.Errorf("episodes[%d]: plan: %w", i, err)
				}
				if t.plan, t.id, err = plans.NewTemplate(full); err != nil {
					return nil, nil, fmt.Errorf("episodes[%d]: plan: %w", i, err)
				}
				byProfile[[2]string{ep.Env, profile}] = t
			}
			ref.Template = t.id
		}
		if len(global)+len(req.GetDrift()) > 0 {
			pos := plans.EpisodePosition(ep)
			ref.DriftValues = append(plans.DriftValues(global, pos, plans.DriftSourceGlobal),
				plans.DriftValues(req.GetDrift(), pos, plans.DriftSourceRun)...)
		}
		// Not derived here: whoever plays the episode derives the rules once
		// (faults.Expand) and records the digest (faults.Seal).
		reply.Plans[i] = ref
	}
	s.planned.Add(context.Background(), int64(len(req.Episodes)))
	used := make(map[string]*gauntletv1.FaultPlan, len(byProfile))
	for _, t := range byProfile {
		used[t.id] = t.plan
	}
	return reply, used, nil
}
