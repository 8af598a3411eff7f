package play

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Output is where a Session sends its episode's events: the one thing that differs between
// the callers that play episodes (the worker and the env API publish segments, a durable
// episode one step per event, the CLI prints, the load-test harness keeps them in memory).
// Calls come from the session's goroutine, in order: Start once, Step per step, Flush when
// the caller waits on its trainer, End once.
type Output interface {
	// Start records the episode's start (after Reset).
	Start(ctx context.Context, st *gauntletv1.EpisodeStarted) error
	// Step records one scored step.
	Step(ctx context.Context, st *gauntletv1.StepTaken) error
	// Flush sends what is queued without waiting for it to be acknowledged.
	Flush() error
	// End records the episode's end; a nil error means every event of the episode is
	// where the output keeps it.
	End(ctx context.Context, e *gauntletv1.EpisodeEnded) error
}

// Publisher is the Output of the worker and the env API: it publishes the episode's
// segments (cut by a Segmenter, up to Max steps each) to GAUNTLET_EVENTS asynchronously,
// and End waits for all their acks, republishing (same message id, so no duplicate) any
// that failed. Set Bus and Max before the first call.
type Publisher struct {
	// Bus carries the publishes.
	Bus *bus.Bus
	// Max is the most steps in one segment.
	Max int
	// Hold keeps the episode's last segment (its end and the steps still pending) in Held
	// instead of publishing it, for the caller to publish in one EventBatch with the other
	// episodes of an assignment. Earlier segments are published as usual, so they are in
	// the stream before Held is.
	Hold bool
	// Held is the last segment End kept, when Hold is set.
	Held *gauntletv1.Event

	seg     Segmenter
	pending []jetstream.PubAckFuture
}

// stall bounds how long an async publish waits for room in the client's window.
const stall = 10 * time.Second

func (p *Publisher) segmenter() *Segmenter {
	if p.seg.Emit == nil {
		p.seg = Segmenter{Max: p.Max, MaxBytes: SegmentBytes(p.Bus.NC.MaxPayload()), Emit: p.event}
	}
	return &p.seg
}

// Start implements Output: the start goes out with the first segment.
func (p *Publisher) Start(_ context.Context, st *gauntletv1.EpisodeStarted) error {
	p.segmenter().Start(st)
	return nil
}

// Step implements Output.
func (p *Publisher) Step(_ context.Context, st *gauntletv1.StepTaken) error {
	return p.segmenter().Step(st)
}

// Flush implements Output: it publishes the queued steps without waiting for their acks
// (a session waiting on its trainer should not hold them back).
func (p *Publisher) Flush() error { return p.segmenter().Flush() }

// End implements Output: it publishes (or, with Hold, keeps) the last segment, then waits
// until the stream has acked every segment published.
func (p *Publisher) End(ctx context.Context, e *gauntletv1.EpisodeEnded) error {
	s := p.segmenter()
	if p.Hold {
		s.Emit = func(ev *gauntletv1.Event) error { p.Held = ev; return nil }
	}
	if err := s.End(e); err != nil {
		return err
	}
	return p.wait(ctx)
}

func (p *Publisher) event(ev *gauntletv1.Event) error {
	f, err := p.Bus.PublishEventAsync(ev, stall)
	if err != nil {
		return err
	}
	p.pending = append(p.pending, f)
	return nil
}

func (p *Publisher) wait(ctx context.Context) error {
	for _, f := range p.pending {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			m := f.Msg()
			var ev gauntletv1.Event
			if uerr := proto.Unmarshal(m.Data, &ev); uerr != nil {
				return fmt.Errorf("republish after %v: %w", err, uerr)
			}
			// Failures are given up on after 30 s, but a stream without room is waited
			// out (bus.Patience): back-pressure, not the episode's failure.
			perr := p.Bus.PublishEventWith(ctx, &ev, bus.Patience{Other: 30 * time.Second})
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
