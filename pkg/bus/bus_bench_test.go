package bus

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func benchServer(b *testing.B) (*Server, *Bus) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s := NewServer(ServerConfig{StoreDir: b.TempDir(), Port: -1}, log)
	if err := s.Starting(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Stopping(context.Background()) })
	bb, err := Connect("", "bench", log, s.ConnectOption())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = bb.Close() })
	if err := bb.EnsureStreams(context.Background(), DefaultStreamConfig()); err != nil {
		b.Fatal(err)
	}
	return s, bb
}

// BenchmarkPublishAsync measures async publishes of 600-byte events with message ids,
// from one goroutine and from many, over the in-process connection.
func BenchmarkPublishAsync(b *testing.B) {
	for _, goroutines := range []int{1, 64, 512} {
		for _, withID := range []bool{true, false} {
			b.Run(fmt.Sprintf("goroutines=%d/msgid=%v", goroutines, withID), func(b *testing.B) {
				_, bb := benchServer(b)
				data := make([]byte, 600)
				b.SetBytes(600)
				b.ResetTimer()
				var wg sync.WaitGroup
				per := b.N/goroutines + 1
				for g := 0; g < goroutines; g++ {
					wg.Add(1)
					go func(g int) {
						defer wg.Done()
						for i := 0; i < per; i++ {
							opts := []jetstream.PublishOpt{jetstream.WithStallWait(10 * time.Second)}
							if withID {
								opts = append(opts, jetstream.WithMsgID(fmt.Sprintf("e%d-%d/step", g, i)))
							}
							if _, err := bb.JS.PublishMsgAsync(&nats.Msg{Subject: SubjectEvent(KindStep, fmt.Sprintf("e%d", g)), Data: data}, opts...); err != nil {
								b.Error(err)
								return
							}
						}
					}(g)
				}
				wg.Wait()
				<-bb.JS.PublishAsyncComplete()
			})
		}
	}
}
