package bus

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Durable consumers of GAUNTLET_EVENTS that an event must have been processed by before
// TrimEvents may remove it.
const (
	// ConsumerStore is the store's consumer: the ClickHouse projection. Events it has not
	// acknowledged are not in ClickHouse yet, so nothing is trimmed while it is missing.
	ConsumerStore = "store"
	// ConsumerEnded is the scheduler's headers-only consumer of ended events; when it
	// exists, ends it has not folded in stay.
	ConsumerEnded = "scheduler-ended"
)

// TrimEvents removes from GAUNTLET_EVENTS the oldest events every required consumer has
// processed, once the stream holds more than history bytes (at most half the stream's
// MaxBytes: processed events never take the room unprocessed ones need). About half of
// history stays afterwards, newest first, for whoever replays recent events from the
// stream. Events the store has not acknowledged are never removed, and nothing is while
// the store's consumer does not exist. It returns how many events it removed.
//
// The stream keeps LimitsPolicy with DiscardNew rather than interest retention: a stream
// created by an older gauntlet upgrades in place (same policy, nothing to migrate), events
// published before the store's first start are kept for it, and the history is a byte
// budget rather than whatever the consumers have not reached yet.
func (b *Bus) TrimEvents(ctx context.Context, history int64) (uint64, error) {
	st, err := b.JS.Stream(ctx, StreamEvents)
	if err != nil {
		return 0, fmt.Errorf("trim %s: open stream: %w", StreamEvents, err)
	}
	si := st.CachedInfo()
	if half := si.Config.MaxBytes / 2; si.Config.MaxBytes > 0 && history > half {
		history = half
	}
	state := si.State
	if state.Msgs == 0 || int64(state.Bytes) <= history {
		return 0, nil
	}
	// Everything below floor has been processed by every required consumer.
	floor := state.LastSeq + 1
	for _, name := range []string{ConsumerStore, ConsumerEnded} {
		c, err := st.Consumer(ctx, name)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			if name == ConsumerStore {
				return 0, nil
			}
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("trim %s: read consumer %s: %w", StreamEvents, name, err)
		}
		ci := c.CachedInfo()
		f := ci.AckFloor.Stream + 1
		if ci.NumPending == 0 && ci.NumAckPending == 0 {
			// Caught up (as of after the stream's state was read): a filtered consumer's
			// ack floor is its last message, not the stream's.
			f = state.LastSeq + 1
		}
		floor = min(floor, f)
	}
	// Keep about half of history, estimated from the stream's average event size.
	if keep := uint64(float64(history/2) / float64(state.Bytes) * float64(state.Msgs)); keep > 0 && state.LastSeq+1 > keep {
		floor = min(floor, state.LastSeq+1-keep)
	}
	if floor <= state.FirstSeq {
		return 0, nil
	}
	if err := st.Purge(ctx, jetstream.WithPurgeSequence(floor)); err != nil {
		return 0, fmt.Errorf("trim %s below sequence %d: %w", StreamEvents, floor, err)
	}
	return floor - state.FirstSeq, nil
}

// RetainEvents trims GAUNTLET_EVENTS (TrimEvents) every every until ctx ends, so what
// the store has written never holds the stream full. A failure is logged once until a
// trim succeeds again (the stream may be briefly unavailable, as when NATS restarts).
func (b *Bus) RetainEvents(ctx context.Context, history int64, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := b.TrimEvents(tctx, history)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			failing = true
			b.log.Warn("trim the events stream; will retry", "err", err)
		case err == nil && failing:
			failing = false
			b.log.Info("trimming the events stream again")
		}
		if n > 0 {
			b.log.Debug("trimmed the events stream", "events", n)
		}
	}
}

// JetStream API errors of a stream or server without room (nats-server's
// JSStreamStoreFailedF with a limit's description, JSInsufficientResourcesErr,
// JSStorageResourcesExceededErr).
const (
	errStreamStoreFailed     jetstream.ErrorCode = 10077
	errInsufficientResources jetstream.ErrorCode = 10023
)

// IsFull reports whether err is a publish refused for lack of room: the stream at its
// MaxBytes or MaxMsgs (DiscardNew), or JetStream's storage exhausted. Such a publish is
// back-pressure to wait out, not a failure: room returns as the store catches up (and
// TrimEvents removes what it wrote) or as disk is freed.
func IsFull(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case errInsufficientResources, errStorageResourcesExceeded:
		return true
	case errStreamStoreFailed:
		return strings.Contains(apiErr.Description, "maximum bytes") || strings.Contains(apiErr.Description, "maximum messages")
	}
	return false
}
