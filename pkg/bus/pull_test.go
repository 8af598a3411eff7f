package bus_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
)

// syncBuffer is a log sink safe for the Pull goroutine and the test to share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Pull keeps delivering after its iterator fails under it (here: the consumer is deleted
// and created again, which ends the iterator with "consumer deleted"), logs the failure,
// and returns once its context ends.
func TestPullReopensAFailedIterator(t *testing.T) {
	b := bustest.Start(t)
	ctx := context.Background()
	cfg := jetstream.ConsumerConfig{
		Durable: "pull-test", FilterSubject: "gauntlet.cmd.pulltest.>",
		AckPolicy: jetstream.AckExplicitPolicy, // GAUNTLET_CMD is a work queue: acked messages are gone
	}
	cons, err := b.JS.CreateOrUpdateConsumer(ctx, bus.StreamCommands, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))

	got := make(chan string, 100)
	pctx, stop := context.WithCancel(ctx)
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		bus.Pull(pctx, cons, log, func(m jetstream.Msg) {
			got <- string(m.Data())
			_ = m.Ack()
		}, jetstream.PullMaxMessages(8), jetstream.PullExpiry(time.Second))
	}()
	publish := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			if _, err := b.JS.Publish(ctx, "gauntlet.cmd.pulltest.x", fmt.Appendf(nil, "m%d", i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Delivery is at least once: a message whose ack was still in flight when the
	// consumer went away comes again, so expect counts distinct messages.
	seen := map[string]bool{}
	expect := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			want := fmt.Sprintf("m%d", i)
			for !seen[want] {
				select {
				case m := <-got:
					seen[m] = true
				case <-time.After(20 * time.Second):
					t.Fatalf("message %s never came; log:\n%s", want, logs.String())
				}
			}
		}
	}
	publish(0, 5)
	expect(0, 5)
	if err := b.JS.DeleteConsumer(ctx, bus.StreamCommands, cfg.Durable); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(logs.String(), "pull from consumer failed; reopening it") {
		if time.Now().After(deadline) {
			t.Fatalf("the failed iterator was never logged; log:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := b.JS.CreateOrUpdateConsumer(ctx, bus.StreamCommands, cfg); err != nil {
		t.Fatal(err)
	}
	publish(5, 10)
	expect(5, 10)

	stop()
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("Pull did not return after its context ended")
	}
}
