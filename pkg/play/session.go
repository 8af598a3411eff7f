// Package play owns the one path every step of every episode takes, whoever chooses its
// actions (a built-in policy in a worker, a model endpoint, or a trainer over the env API):
// the episode is built from its request and fault plan, reset, and each action is applied
// to the env, timed, recorded as a StepTaken, scored by the reward service (Scorer, over
// NATS request/reply) and published to GAUNTLET_EVENTS in segments that carry the
// episode's start (first segment) and end (last segment), so the store projects it into
// ClickHouse. A trajectory therefore looks the same whoever played it.
//
// Concurrency: a Session belongs to one goroutine at a time (callers serialise its
// methods); a Scorer is shared by many sessions and is safe for concurrent use.
package play

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/templates"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// ErrAbandoned marks an episode given up because its context ended (the process stopping).
var ErrAbandoned = errors.New("episode abandoned: context ended")

// Session is one episode being played: its env episode, its events publisher and the
// running totals of its EpisodeEnded.
type Session struct {
	// Req and Plan are what the episode was assigned.
	Req  *gauntletv1.EpisodeRequested
	Plan *gauntletv1.FaultPlan
	// Env is the episode's env, known after Prepare.
	Env env.Env
	// Ended accumulates the episode's end: steps, reward, faults; Finish publishes it.
	Ended *gauntletv1.EpisodeEnded
	// Sandboxes lends real sandboxes to envs that need them (codefix); set it before
	// Prepare. Nil when this process runs no sandbox runtime.
	Sandboxes env.Sandboxes
	// Templates finds the templates compact plans of user-defined profiles name; set it
	// before Prepare. Nil only where every plan is built-in or whole.
	Templates *templates.Client
	// Hold, set before Finish, keeps the episode's last segment (its end and the steps
	// still pending) instead of publishing it: Finish leaves it in Held, for the caller to
	// publish in one EventBatch with the other episodes of an assignment. Earlier
	// segments are published as usual, so they are in the stream before Held is.
	Hold bool
	// Held is the last segment Finish kept, when Hold is set.
	Held *gauntletv1.Event

	workerID string
	profile  string // the plan's, read per step without touching the plan
	episode  env.Episode
	pub      *publisher
	step     uint32
	reply    chan ScoreResult
	done     bool
}

// NewSession allocates the session of an assigned episode, played by workerID (a worker
// id, or the env API's id), publishing steps in segments of up to segment steps.
func NewSession(b *bus.Bus, segment int, a *gauntletv1.EpisodeAssigned, workerID string) *Session {
	return &Session{
		Req: a.Episode, Plan: a.Plan, workerID: workerID, profile: a.Plan.GetProfile(),
		pub:   newPublisher(b, segment),
		reply: make(chan ScoreResult, 1),
		Ended: &gauntletv1.EpisodeEnded{
			Episode: a.Episode, Profile: a.Plan.GetProfile(), Plan: a.Plan, WorkerId: workerID,
			StartedAtUnixNano: time.Now().UnixNano(),
		},
	}
}

// Prepare builds the env episode from the request and the fault plan, expanding a compact
// plan (pkg/faults/plans.Expand) first; Plan stays as assigned, compact, for the record. Its
// errors are the request's fault (unknown env, bad params, bad plan, a template not found);
// Fail records them.
func (s *Session) Prepare(ctx context.Context) (env.Env, error) {
	e, err := env.Lookup(s.Req.Env)
	if err != nil {
		return nil, fmt.Errorf("env: %w", err)
	}
	var plan *gauntletv1.FaultPlan
	if s.Templates != nil {
		plan, err = s.Templates.Expand(ctx, s.Plan, servicesOf(s.Req.Env, e))
	} else {
		plan, err = plans.Expand(s.Plan, servicesOf(s.Req.Env, e), nil)
	}
	if err != nil {
		return nil, fmt.Errorf("fault plan: %w", err)
	}
	plans.Seal(s.Plan, plan) // the end records the digest of the plan played
	inj, err := inject.NewInjector(plan)
	if err != nil {
		return nil, fmt.Errorf("fault plan: %w", err)
	}
	ep, err := e.NewEpisode(env.Config{Seed: s.Req.Seed, Params: json.RawMessage(s.Req.ParamsJson), MaxSteps: s.Req.MaxSteps, Faults: inj, Sandboxes: s.Sandboxes})
	if err != nil {
		return nil, err
	}
	s.Env, s.episode = e, ep
	return e, nil
}

// envServices holds each registered env's services (env name → []string), read from its
// Spec once: a Spec builds every tool's schema and description, and building one per
// episode was 2.4 % of a worker's allocations. A registered env's spec does not change.
var envServices sync.Map

// servicesOf returns the services of e, registered as name.
func servicesOf(name string, e env.Env) []string {
	if v, ok := envServices.Load(name); ok {
		return v.([]string)
	}
	svcs := e.Spec().Services
	envServices.Store(name, svcs)
	return svcs
}

// Reset resets the prepared episode and records its start, which goes out with the first
// segment of steps (attempt counts the deliveries of a worker's assignment; 1 otherwise).
// Its errors are infra errors.
func (s *Session) Reset(attempt uint32) (json.RawMessage, error) {
	if s.episode == nil {
		return nil, errors.New("reset before prepare")
	}
	obs, err := s.episode.Reset()
	if err != nil {
		return nil, fmt.Errorf("reset %s: %w", s.Req.EpisodeId, err)
	}
	// The plan goes with the end (and into ClickHouse); the start stays small.
	s.pub.Start(&gauntletv1.EpisodeStarted{
		Episode: s.Req, WorkerId: s.workerID, StartedAtUnixNano: s.Ended.StartedAtUnixNano,
		ObservationJson: string(obs), Attempt: attempt,
	})
	return obs, nil
}

// Steps is how many steps the session has played.
func (s *Session) Steps() uint32 { return s.step }

// Done reports whether the episode reached its end (terminated or truncated by the env).
func (s *Session) Done() bool { return s.done }

// Step plays one action through the pipeline: the env applies it (its wall time metered),
// the reward service scores it, and the scored step is queued for publishing. trainer,
// when not nil, is the trainer's data for the step, recorded with it. A non-nil error is an
// infra error (or ErrAbandoned when ctx ended); the episode must then be ended with Fail
// or FinishInfra.
func (s *Session) Step(ctx context.Context, scorer *Scorer, act env.Action, trainer *gauntletv1.TrainerData) (*gauntletv1.StepTaken, env.StepResult, error) {
	if s.done {
		return nil, env.StepResult{}, errors.New("step after the episode ended")
	}
	res, err := env.ApplyStep(s.episode, act)
	if err != nil {
		return nil, res, fmt.Errorf("step %d of %s: %w", s.step, s.Req.EpisodeId, err)
	}
	st := env.StepEvent(s.Req, s.profile, s.workerID, s.step, act, res, s.episode.Now())
	st.Trainer = trainer
	score, err := scorer.Score(ctx, st, s.reply)
	if err != nil {
		if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, res, ErrAbandoned
		}
		// The reply may still arrive on the reused channel; a fresh one keeps it away
		// from the next step.
		s.reply = make(chan ScoreResult, 1)
		return nil, res, err
	}
	st.Score = score
	if err := s.pub.Step(st); err != nil {
		return nil, res, err
	}
	env.CountStep(s.Ended, s.step, res, score.GetTotal())
	s.step++
	s.done = res.Done()
	return st, res, nil
}

// Flush publishes the steps queued so far without waiting for their acks (a session
// waiting on its trainer should not hold them back).
func (s *Session) Flush() error { return s.pub.Flush() }

// Fail ends the episode at once as terminated by a failure of the request itself (bad env,
// params or plan), recording err, and publishes the end.
func (s *Session) Fail(ctx context.Context, err error) error {
	s.Ended.Terminated = true
	s.Ended.Reason = gauntletv1.TerminationReason_TERMINATION_REASON_FAILURE
	s.Ended.Error = err.Error()
	return s.Finish(ctx)
}

// Truncate ends a running episode from outside (a timeout, an idle reaper, a client's
// close) with reason and a note of why, and publishes the end.
func (s *Session) Truncate(ctx context.Context, reason gauntletv1.TerminationReason, why string) error {
	s.Ended.Truncated = true
	s.Ended.Reason = reason
	s.Ended.Error = why
	return s.Finish(ctx)
}

// FinishInfra ends the episode as an infra error (gauntlet failed, not the policy), so
// trainers mask it rather than punish it, and publishes the end.
func (s *Session) FinishInfra(ctx context.Context, err error) error {
	s.Ended.Terminated = false
	s.Ended.Truncated = true
	s.Ended.Reason = gauntletv1.TerminationReason_TERMINATION_REASON_INFRA_ERROR
	s.Ended.InfraError = true
	s.Ended.Error = err.Error()
	return s.Finish(ctx)
}

// Finish publishes the last segment (the pending steps and the episode's end), then waits
// until the stream has acked every segment of the episode (republishing, under the same
// message id, any publish that failed). A nil error means the whole episode is in the
// stream, or, with Hold, all of it but Held.
func (s *Session) Finish(ctx context.Context) error {
	s.done = true
	if s.episode != nil {
		s.Ended.VirtualTimeNs = int64(s.episode.Now())
	}
	s.Ended.EndedAtUnixNano = time.Now().UnixNano()
	if s.Hold {
		s.pub.Emit = func(ev *gauntletv1.Event) error { s.Held = ev; return nil }
	}
	if err := s.pub.End(s.Ended); err != nil {
		return err
	}
	return s.pub.wait(ctx)
}

// Close releases what the env episode holds (a sandbox, for envs that use one). Call it
// once the session is over, whether it finished or was abandoned; it is safe to call on a
// session that never prepared and to call more than once.
func (s *Session) Close() error {
	ep := s.episode
	s.episode = nil
	if ep == nil {
		return nil
	}
	return env.Close(ep)
}

// publisher publishes one episode's segments (cut by a Segmenter) asynchronously and
// waits for all their acks at the end, republishing (same message id, so no duplicate)
// any that failed.
type publisher struct {
	Segmenter
	bus     *bus.Bus
	stall   time.Duration
	pending []jetstream.PubAckFuture
}

func newPublisher(b *bus.Bus, segment int) *publisher {
	p := &publisher{bus: b, stall: 10 * time.Second}
	p.Segmenter = Segmenter{Max: segment, Emit: p.event}
	return p
}

func (p *publisher) event(ev *gauntletv1.Event) error {
	f, err := p.bus.PublishEventAsync(ev, p.stall)
	if err != nil {
		return err
	}
	p.pending = append(p.pending, f)
	return nil
}

func (p *publisher) wait(ctx context.Context) error {
	for _, f := range p.pending {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			m := f.Msg()
			var ev gauntletv1.Event
			if uerr := proto.Unmarshal(m.Data, &ev); uerr != nil {
				return fmt.Errorf("republish after %v: %w", err, uerr)
			}
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			perr := p.bus.PublishEvent(rctx, &ev)
			cancel()
			if perr != nil {
				return fmt.Errorf("publish %s: %w (first error: %v)", m.Subject, perr, err)
			}
		case <-ctx.Done():
			return ErrAbandoned
		}
	}
	p.pending = p.pending[:0]
	return nil
}
