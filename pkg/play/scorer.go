package play

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/errkind"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	"github.com/gauntlet-rl/gauntlet/pkg/telemetry"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Scorer batches the score requests of all episodes running on this worker: each episode
// waits for its own step's score, while the scorer sends whatever has queued up as one
// ScoreRequest. Under load batches grow by themselves (no linger timer), so a lone episode
// pays one round trip and a busy worker pays a fraction of one per step.
type Scorer struct {
	bus      func() *bus.Bus
	maxBatch int
	inFlight chan struct{} // bounds concurrent requests
	reqs     chan scoreCall
	latency  metric.Float64Histogram
	size     metric.Int64Histogram
	// unread holds, by digest, what the reward service said a spec does not read
	// (ScoreSpec.actions_unread, faults_unread), as an unread: its steps' requests leave
	// that out.
	unread sync.Map
}

// unread is what a spec does not read of a step, as the reward service said.
type unread struct{ actions, faults bool }

type scoreCall struct {
	step  *gauntletv1.StepTaken
	named *EpisodeScoring
	reply chan ScoreResult
}

// ScoreResult is the reply to one Score call.
type ScoreResult struct {
	score *gauntletv1.StepScored
	state []byte
	err   error
}

// EpisodeScoring is what an episode scored under a spec its run named (not the env's
// default) carries from step to step: the spec's digest, which the reward service looks
// up, and the RewardState the last step's score left, which the next step's request
// carries (running normalisation, shaping and expressions over the episode so far need
// it). Episodes under the default spec have none, and their requests stay as they were.
type EpisodeScoring struct {
	Spec string
	// State is the RewardState in its wire form, as the reward service returned it
	// (ScoreTable.encoded_states): the worker keeps it and sends it back without reading
	// it. Empty before the first step. A score replaces it and never writes into it, so a
	// copy of the slice stays the state it was.
	State []byte
}

// NewEpisodeScoring returns the scoring state of an episode of req, or nil when it is
// scored under its env's default spec.
func NewEpisodeScoring(req *gauntletv1.EpisodeRequested) *EpisodeScoring {
	d := req.GetRewardSpec()
	if d == "" || d == scoring.DefaultDigest() {
		return nil
	}
	return &EpisodeScoring{Spec: d}
}

// clone returns an independent copy, for a branch of the episode.
func (e *EpisodeScoring) clone() *EpisodeScoring {
	if e == nil {
		return nil
	}
	return &EpisodeScoring{Spec: e.Spec, State: slices.Clone(e.State)}
}

// NewScorer allocates a scorer sending up to maxBatch steps per request and maxInFlight
// requests at once; its metrics are named after prefix (e.g. "gauntlet_worker").
func NewScorer(getBus func() *bus.Bus, maxBatch, maxInFlight int, meter metric.Meter, prefix string) *Scorer {
	return &Scorer{
		bus:      getBus,
		maxBatch: maxBatch,
		inFlight: make(chan struct{}, maxInFlight),
		reqs:     make(chan scoreCall, 4*maxBatch),
		latency: telemetry.Must(meter.Float64Histogram(prefix+"_score_request_seconds",
			metric.WithDescription("Round trip of one score request to the reward service."),
			metric.WithExplicitBucketBoundaries(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1))),
		size: telemetry.Must(meter.Int64Histogram(prefix+"_score_batch_steps",
			metric.WithDescription("Steps per score request."),
			metric.WithExplicitBucketBoundaries(1, 4, 16, 64, 128, 256, 512, 1024))),
	}
}

// Score returns the reward service's score for one step, in the values form
// (gauntletv1.ScoreReply.LeanStepScores; StepScored.Full names its components); named,
// when not nil, is the episode's spec and state, which a successful score advances.
func (s *Scorer) Score(ctx context.Context, st *gauntletv1.StepTaken, named *EpisodeScoring, reply chan ScoreResult) (*gauntletv1.StepScored, error) {
	select {
	case s.reqs <- scoreCall{step: st, named: named, reply: reply}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case r := <-reply:
		if r.err == nil && named != nil {
			named.State = r.state
		}
		return r.score, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Run batches calls until ctx ends; Score calls wait for it.
func (s *Scorer) Run(ctx context.Context) {
	for {
		var first scoreCall
		select {
		case first = <-s.reqs:
		case <-ctx.Done():
			return
		}
		select {
		case s.inFlight <- struct{}{}:
		case <-ctx.Done():
			first.reply <- ScoreResult{err: ctx.Err()}
			return
		}
		batch := []scoreCall{first}
	fill:
		for len(batch) < s.maxBatch {
			select {
			case c := <-s.reqs:
				batch = append(batch, c)
			default:
				break fill
			}
		}
		go func() {
			defer func() { <-s.inFlight }()
			s.send(ctx, batch)
		}()
	}
}

func (s *Scorer) send(ctx context.Context, batch []scoreCall) {
	// The reward service scores from a step's signals and metering (pkg/scoring); the
	// observation and diff, the bulk of a step, stay here. A step of a named spec also
	// carries its action (a pointer to the step's own, no copy), which a repeat detector
	// reads, and the kind of a fault that answered its call (scoring.AnsweredFaults: a
	// shared message, no copy), which an idle or repeat detector holding under faults
	// reads, each until a reply says the spec reads none: the env's default spec never
	// does, so its requests stay as small as they were.
	req := &gauntletv1.ScoreRequest{Steps: make([]*gauntletv1.StepTaken, len(batch))}
	var (
		last int // 1 + the index in req.SpecDigests of the last named step's spec
		un   unread
	)
	for i, c := range batch {
		req.Steps[i] = &gauntletv1.StepTaken{
			EpisodeId: c.step.EpisodeId, Step: c.step.Step, Env: c.step.Env,
			Signals: c.step.Signals, Metering: c.step.Metering,
		}
		if c.named == nil {
			continue
		}
		if req.EncodedStates == nil {
			// Each spec's 71-byte digest once, each step's by its index; each episode's
			// state as the reward service encoded it, not decoded here.
			req.EncodedStates = make([][]byte, len(batch))
			req.SpecOf = make([]uint32, len(batch))
		}
		if last == 0 || req.SpecDigests[last-1] != c.named.Spec { // a batch's steps mostly share one
			last = slices.Index(req.SpecDigests, c.named.Spec) + 1
			if last == 0 {
				req.SpecDigests = append(req.SpecDigests, c.named.Spec)
				last = len(req.SpecDigests)
			}
			un = unread{}
			if v, ok := s.unread.Load(c.named.Spec); ok {
				un = v.(unread)
			}
		}
		req.SpecOf[i], req.Steps[i].Terminated = uint32(last), c.step.Terminated
		if !un.actions {
			req.Steps[i].Action = c.step.Action
		}
		if !un.faults {
			req.Steps[i].Faults = scoring.AnsweredFaults(c.step.Faults)
		}
		req.EncodedStates[i] = c.named.State
	}
	var reply gauntletv1.ScoreReply
	// Bounded: a reward service missing for this long is an infra error for the episode.
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	t0 := time.Now()
	err := s.bus().Request(rctx, bus.SubjectScore, req, &reply)
	s.latency.Record(ctx, time.Since(t0).Seconds())
	s.size.Record(ctx, int64(len(batch)))
	var scores []*gauntletv1.StepScored
	if err == nil && reply.Error != "" {
		err = fmt.Errorf("reward service: %w", errkind.FromReply(reply.Error, reply.ErrorKind))
	} else if err == nil {
		// In the values form: a step's score is its spec's values, not a message per
		// component (StepScored.Full gives those back).
		scores, err = reply.LeanStepScores(req.Steps)
	}
	if err == nil && req.EncodedStates != nil && len(reply.GetTable().GetEncodedStates()) != len(req.Steps) {
		// A reward service that predates them would score every step as an episode's first.
		err = errkind.E(errkind.Internal, fmt.Errorf("reward service returned %d encoded states for %d steps of named specs", len(reply.GetTable().GetEncodedStates()), len(req.Steps)))
	}
	if err == nil && req.EncodedStates != nil {
		for _, sp := range reply.Table.Specs {
			if (sp.GetActionsUnread() || sp.GetFaultsUnread()) && sp.GetDigest() != "" {
				if _, known := s.unread.Load(sp.Digest); !known {
					// The reply aliases its message.
					s.unread.Store(strings.Clone(sp.Digest), unread{actions: sp.ActionsUnread, faults: sp.FaultsUnread})
				}
			}
		}
	}
	for i, c := range batch {
		if err != nil {
			c.reply <- ScoreResult{err: fmt.Errorf("score step: %w", err)}
			continue
		}
		r := ScoreResult{score: scores[i]}
		if c.named != nil {
			// It shares the reply's memory, as the step's score does.
			r.state = reply.Table.EncodedStates[i]
		}
		c.reply <- r
	}
}

// StepScorer scores one step for a Session. named is the episode's named spec and its
// state (nil under the env's default spec), advanced by a successful score. reply is the
// session's own channel, reused step after step so that waiting for a score allocates
// nothing; scorers that answer in the caller's goroutine ignore it.
type StepScorer interface {
	Score(ctx context.Context, st *gauntletv1.StepTaken, named *EpisodeScoring, reply chan ScoreResult) (*gauntletv1.StepScored, error)
}

// LocalScorer scores steps in process with the reward service's own pure function
// (scoring.ScoreState), for runners with no reward service to ask: the CLI's fork and the
// load-test harness. Spec is the episode's reward spec (scoring.SpecFor for the default).
type LocalScorer struct{ Spec scoring.Spec }

// Score implements StepScorer.
func (l LocalScorer) Score(_ context.Context, st *gauntletv1.StepTaken, named *EpisodeScoring, _ chan ScoreResult) (*gauntletv1.StepScored, error) {
	if named == nil {
		return scoring.Score(l.Spec, st), nil
	}
	var state gauntletv1.RewardState
	if err := state.DecodeReusing(named.State); err != nil {
		return nil, fmt.Errorf("score step %d of %s: %w", st.GetStep(), st.GetEpisodeId(), err)
	}
	sc := scoring.ScoreState(l.Spec, &state, st)
	enc, err := state.AppendEncoded(nil)
	if err != nil {
		return nil, fmt.Errorf("score step %d of %s: %w", st.GetStep(), st.GetEpisodeId(), err)
	}
	named.State = enc
	return sc, nil
}
