package bus

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Pull hands cons's messages to fn, one at a time, until ctx ends, reading them through a
// pull iterator (cons.Messages(opts...)). When ctx ends it drains the iterator: fn also
// gets the messages the client had already buffered, and should give them back (Nak)
// or finish them, as it sees ctx is done. Then Pull returns.
//
// An iterator that fails while ctx is live does not end the loop: the failure is logged
// and a new iterator opened after a pause (0.1 s, doubling up to 5 s while failures
// repeat). A consumer that stops delivering is the worst failure a service of this
// pipeline can have, because nothing else notices it: work piles up, assigned and
// unplayed, and a run simply never finishes.
func Pull(ctx context.Context, cons jetstream.Consumer, log *slog.Logger, fn func(jetstream.Msg), opts ...jetstream.PullMessagesOpt) {
	const (
		firstPause = 100 * time.Millisecond
		maxPause   = 5 * time.Second
	)
	name := cons.CachedInfo().Name
	pause := firstPause
	for {
		it, err := cons.Messages(opts...)
		if err == nil {
			stopDrain := context.AfterFunc(ctx, it.Drain)
			for {
				var msg jetstream.Msg
				if msg, err = it.Next(); err != nil {
					break
				}
				pause = firstPause
				fn(msg)
			}
			stopDrain()
			it.Stop()
		}
		if ctx.Err() != nil {
			return
		}
		log.Error("pull from consumer failed; reopening it", "consumer", name, "err", err, "pause", pause)
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, maxPause)
	}
}
