package play

import (
	"time"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Segmenter cuts one episode's events into the StepsTaken segments that go on
// GAUNTLET_EVENTS: up to Max consecutive steps each, the start riding on the first segment
// and the end on the last, so an episode of at most Max steps is one message. A segment
// also goes out once its first step has waited a second (a session waiting on its
// trainer; not at the episode's last step, which waits for the end that follows it),
// whenever Flush is called, and before a step that would take it over MaxBytes
// (its values' lengths are counted, not encoded: normal steps pay no encoding pass).
//
// The worker's publisher and the load-test harness's event generator both use it, so the
// harness's ceiling is measured on exactly the events the pipeline publishes.
type Segmenter struct {
	// Max is the most steps in one segment.
	Max int
	// MaxBytes bounds a segment's size without its end (0: no bound): a step that would
	// take the queued ones over it goes into the next segment. SegmentBytes derives it
	// from the stream's payload limit.
	MaxBytes int
	// Emit receives each segment, wrapped in its Event.
	Emit func(*gauntletv1.Event) error

	started   *gauntletv1.EpisodeStarted // not yet emitted
	steps     []*gauntletv1.StepTaken
	size      int // the queued start's and steps' estimated encoded size
	lastFlush time.Time
}

// Start records the episode's start; it goes out with the first segment.
func (g *Segmenter) Start(st *gauntletv1.EpisodeStarted) {
	g.started = st
	g.size = len(st.GetObservationJson()) + recordOverhead
}

// recordOverhead bounds what a step, a start or a segment takes on the wire beside the
// values counted by length (ids, metering, signals, score, a few faults).
const recordOverhead = 4 << 10

// stepSize is an upper bound on st's encoded size, for MaxBytes: its variable-length
// values counted by length (a token id takes at most 5 bytes, a logprob 4).
func stepSize(st *gauntletv1.StepTaken) int {
	n := len(st.GetAction().GetTool()) + len(st.GetAction().GetArgsJson()) + len(st.ObservationJson) +
		len(st.StateDiffJson) + len(st.Faults)*512 + recordOverhead
	if td := st.Trainer; td != nil {
		n += 5*(len(td.PromptTokenIds)+len(td.CompletionTokenIds)) + 4*len(td.Logprobs) + len(td.PolicyVersion)
	}
	return n
}

// SegmentBytes is the MaxBytes for segments published on a connection whose messages may
// carry up to maxPayload bytes: three quarters of it, leaving the rest for the episode's
// end (with its fault plan), a batch's envelope and the estimate's slack. With NATS's
// default of 1 MiB that is 768 KiB; one step is never split, and its values are held to
// MaxFieldBytes.
func SegmentBytes(maxPayload int64) int { return int(maxPayload / 4 * 3) }

// Step queues one step, emitting the segment when it is full or has waited a second,
// unless the step ends the episode: End then emits it with the end.
func (g *Segmenter) Step(st *gauntletv1.StepTaken) error {
	if g.MaxBytes > 0 {
		n := stepSize(st)
		if g.size+n > g.MaxBytes && len(g.steps) > 0 {
			if err := g.Flush(); err != nil {
				return err
			}
		}
		g.size += n
	}
	if len(g.steps) == 0 && g.lastFlush.IsZero() {
		g.lastFlush = time.Now()
	}
	if g.steps == nil {
		// Room for a typical episode (an oracle's shop episode is under 8 steps) at once,
		// instead of growing through 1, 2, 4 and 8.
		g.steps = make([]*gauntletv1.StepTaken, 0, min(g.Max, 8))
	}
	g.steps = append(g.steps, st)
	// The episode's last step waits for its end, which follows at once: sent now, the
	// end would go alone, one more message for nothing.
	if st.Terminated || st.Truncated {
		return nil
	}
	if len(g.steps) >= g.Max || time.Since(g.lastFlush) > time.Second {
		return g.Flush()
	}
	return nil
}

// Flush emits the queued steps, if any, as one segment (with the start, if it has not gone
// out yet). A start without steps waits for them or for the end.
func (g *Segmenter) Flush() error {
	if len(g.steps) == 0 {
		return nil
	}
	return g.emit(nil)
}

// End emits the last segment: the queued steps, the start if it is still pending, and
// the end.
func (g *Segmenter) End(ended *gauntletv1.EpisodeEnded) error { return g.emit(ended) }

func (g *Segmenter) emit(ended *gauntletv1.EpisodeEnded) error {
	seg := &gauntletv1.StepsTaken{Steps: g.steps, Started: g.started, Ended: ended}
	g.steps, g.started, g.size = nil, nil, 0
	g.lastFlush = time.Now()
	return g.Emit(&gauntletv1.Event{Body: &gauntletv1.Event_Steps{Steps: seg}})
}
