// Package reward is the reward service: it scores every step outside the
// sandbox, over NATS request/reply, so no agent or env can reach the scoring code or its
// spec. Workers batch steps into one ScoreRequest; any number of reward instances share the
// load through the queue group. Scoring itself is pkg/scoring's pure function, so the same
// step always gets the same score and a recorded trajectory can be re-scored.
//
// A step names its spec by digest (StepTaken.reward_spec, from the run): no digest, or the
// built-in spec's, scores it under the env's default spec; any other is read once from the
// gauntlet_reward_specs KV bucket (pkg/rewardspecs) and cached. A spec the bucket does not
// hold is a not-found error reply, a bucket that fails an unavailable one. A request may
// name each digest once (spec_digests) and each step's by its index (spec_of). Steps of a
// stateful spec come with their episode's RewardState, which the reply returns advanced,
// in the form the request used: messages, or their wire form, which the worker keeps
// without reading.
//
// Handlers run on NATS subscription goroutines (Config.Subscribers of them); the spec
// caches are safe for concurrent use. A request that cannot be decoded is answered with an error
// reply, never dropped, so the worker fails the episode as an infra error instead of waiting.
package reward

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/metric"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/errkind"
	"github.com/gauntlet-rl/gauntlet/pkg/rewardspecs"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	"github.com/gauntlet-rl/gauntlet/pkg/telemetry"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// QueueGroup is the NATS queue group reward instances share.
const QueueGroup = "reward"

// Config configures the service.
type Config struct {
	// Subscribers is how many subscriptions (handler goroutines) the instance runs.
	Subscribers int
}

// Service is the reward service.
type Service struct {
	cfg   Config
	bus   func() *bus.Bus
	log   *slog.Logger
	subs  []*nats.Subscription
	specs sync.Map // env name -> scoring.Spec
	named *rewardspecs.Client

	scored   metric.Int64Counter
	requests metric.Int64Counter
}

// New allocates the service; getBus returns the connected bus once its module started.
func New(cfg Config, getBus func() *bus.Bus, meter metric.Meter, log *slog.Logger) *Service {
	if cfg.Subscribers < 1 {
		cfg.Subscribers = 1
	}
	return &Service{
		cfg: cfg, bus: getBus, log: log,
		scored:   telemetry.Must(meter.Int64Counter("gauntlet_reward_steps_scored_total", metric.WithDescription("Steps scored."))),
		requests: telemetry.Must(meter.Int64Counter("gauntlet_reward_requests_total", metric.WithDescription("Score requests answered."))),
	}
}

// Starting subscribes to the score subject.
func (s *Service) Starting(ctx context.Context) error {
	nc := s.bus().NC
	s.named = rewardspecs.NewClient(s.bus().JS)
	for i := 0; i < s.cfg.Subscribers; i++ {
		sub, err := nc.QueueSubscribe(bus.SubjectScore, QueueGroup, s.handle)
		if err != nil {
			return fmt.Errorf("subscribe %s: %w", bus.SubjectScore, err)
		}
		// Batches from many workers may queue up behind a slow handler; never drop them.
		if err := sub.SetPendingLimits(-1, 256<<20); err != nil {
			return fmt.Errorf("set pending limits: %w", err)
		}
		s.subs = append(s.subs, sub)
	}
	return nc.FlushTimeout(10 * time.Second)
}

// Running waits for the stop.
func (s *Service) Running(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

// Stopping drains the subscriptions so requests already received are answered.
func (s *Service) Stopping(context.Context) error {
	for _, sub := range s.subs {
		_ = sub.Drain()
	}
	return nil
}

func (s *Service) handle(m *nats.Msg) {
	reply := s.Score(m.Data)
	data, err := gauntletv1.Marshal(reply)
	if err != nil {
		s.log.Error("marshal score reply", "err", err)
		return
	}
	if err := m.Respond(data); err != nil {
		s.log.Warn("respond to score request", "err", err)
	}
}

// Score decodes a ScoreRequest and scores its steps in order, into a ScoreTable (read it
// with ScoreReply.StepScores). The reply may share data's memory (the request is decoded
// aliasing it): encode it before data changes.
func (s *Service) Score(data []byte) *gauntletv1.ScoreReply {
	var req gauntletv1.ScoreRequest
	if err := gauntletv1.UnmarshalAliasing(data, &req); err != nil {
		return &gauntletv1.ScoreReply{Error: fmt.Sprintf("decode score request: %v", err), ErrorKind: gauntletv1.ErrorKind_ERROR_KIND_INVALID}
	}
	if err := checkRequest(&req); err != nil {
		return &gauntletv1.ScoreReply{Error: "score request: " + err.Error(), ErrorKind: gauntletv1.ErrorKind_ERROR_KIND_INVALID}
	}
	named, err := s.namedSpecs(req.Steps)
	if err != nil {
		text, kind := errkind.Reply(err)
		return &gauntletv1.ScoreReply{Error: text, ErrorKind: kind}
	}
	// A table, not a StepScored per step: the names and weights go once per reply, and
	// the worker reads it with a handful of allocations instead of about ten per step.
	var table *gauntletv1.ScoreTable
	specFor := func(env, digest string) scoring.Spec {
		if sp, ok := named[digest]; ok {
			return sp.ForEnv(env)
		}
		return s.spec(env)
	}
	switch {
	case len(req.EncodedStates) > 0:
		if table, err = scoring.TableEncodedStates(specFor, req.Steps, req.EncodedStates); err != nil {
			return &gauntletv1.ScoreReply{Error: "score request: encoded_states: " + err.Error(), ErrorKind: gauntletv1.ErrorKind_ERROR_KIND_INVALID}
		}
	case named == nil && len(req.States) == 0:
		table = scoring.Table(s.spec, req.Steps)
	default:
		table = scoring.TableStates(specFor, req.Steps, req.States)
	}
	reply := &gauntletv1.ScoreReply{Table: table}
	ctx := context.Background()
	s.requests.Add(ctx, 1)
	s.scored.Add(ctx, int64(len(req.Steps)))
	return reply
}

// checkRequest checks the lengths and indexes of req's per-step fields, and gives each
// step that names its spec by spec_of the digest it names (aliasing req's memory, as the
// rest of it does).
func checkRequest(req *gauntletv1.ScoreRequest) error {
	n := len(req.Steps)
	if k := len(req.States); k != 0 && k != n {
		return fmt.Errorf("states: %d for %d steps", k, n)
	}
	if k := len(req.EncodedStates); k != 0 && k != n {
		return fmt.Errorf("encoded_states: %d for %d steps", k, n)
	}
	if len(req.States) != 0 && len(req.EncodedStates) != 0 {
		return errors.New("states and encoded_states: a request sends one or the other")
	}
	if k := len(req.SpecOf); k != 0 && k != n {
		return fmt.Errorf("spec_of: %d for %d steps", k, n)
	}
	for i, k := range req.SpecOf {
		switch {
		case k == 0:
		case int(k) > len(req.SpecDigests):
			return fmt.Errorf("spec_of[%d]: %d, past the %d spec_digests", i, k, len(req.SpecDigests))
		default:
			req.Steps[i].RewardSpec = req.SpecDigests[k-1]
		}
	}
	return nil
}

// namedSpecs returns the specs steps name by digest other than the built-in one, or nil
// when they name none (the common case, which costs a string comparison per step).
func (s *Service) namedSpecs(steps []*gauntletv1.StepTaken) (map[string]scoring.Spec, error) {
	var (
		named map[string]scoring.Spec
		last  string // the digest of the last step looked up: a request's steps mostly share one
	)
	for _, st := range steps {
		d := st.GetRewardSpec()
		if d == "" || d == last || d == scoring.DefaultDigest() {
			continue
		}
		if _, ok := named[d]; ok {
			last = d
			continue
		}
		if s.named == nil {
			return nil, errkind.E(errkind.Unavailable, errors.New("reward service not started: cannot read named specs"))
		}
		ctx, cancel := context.WithTimeout(context.Background(), specTimeout)
		sp, err := s.named.Get(ctx, d)
		cancel()
		switch {
		case errors.Is(err, rewardspecs.ErrNotFound):
			return nil, errkind.E(errkind.NotFound, fmt.Errorf("score step %d of %s: %w", st.GetStep(), st.GetEpisodeId(), err))
		case errors.Is(err, scoring.ErrInvalidSpec):
			return nil, errkind.E(errkind.Invalid, fmt.Errorf("score step %d of %s: %w", st.GetStep(), st.GetEpisodeId(), err))
		case err != nil:
			return nil, errkind.E(errkind.Unavailable, fmt.Errorf("score step %d of %s: %w", st.GetStep(), st.GetEpisodeId(), err))
		}
		if named == nil {
			named = make(map[string]scoring.Spec)
		}
		named[d], last = sp, d
	}
	return named, nil
}

// specTimeout bounds reading a spec from its bucket, the first time an instance meets it.
const specTimeout = 5 * time.Second

func (s *Service) spec(env string) scoring.Spec {
	if v, ok := s.specs.Load(env); ok {
		return v.(scoring.Spec)
	}
	sp := scoring.SpecFor(env)
	s.specs.Store(env, sp)
	return sp
}
