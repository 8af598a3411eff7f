package bus

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"syscall"
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

// BenchmarkWorkQueueCycle measures one assignment's whole trip through the work queue:
// an async publish with a message id, delivery to a pull consumer, and the ack that
// removes it. One op is one episode; with batch=K an op is a K-th of a message carrying K
// 200-byte episodes. It reports the process's CPU per op beside the wall time.
func BenchmarkWorkQueueCycle(b *testing.B) {
	for _, batch := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			_, bb := benchServer(b)
			ctx := context.Background()
			cons, err := bb.JS.CreateOrUpdateConsumer(ctx, StreamCommands, jetstream.ConsumerConfig{
				Durable: "bench", FilterSubject: SubjectEpisodePrefix + ">",
				AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 100_000,
			})
			if err != nil {
				b.Fatal(err)
			}
			msgs := (b.N + batch - 1) / batch
			data := make([]byte, 200*batch)
			done := make(chan struct{})
			got := 0
			cc, err := cons.Consume(func(m jetstream.Msg) {
				_ = m.Ack()
				got++
				if got == msgs {
					close(done)
				}
			}, jetstream.PullMaxMessages(64))
			if err != nil {
				b.Fatal(err)
			}
			defer cc.Stop()
			cpu0 := cpuTime()
			b.ResetTimer()
			for i := 0; i < msgs; i++ {
				if _, err := bb.JS.PublishMsgAsync(&nats.Msg{Subject: SubjectEpisode("r1"), Data: data},
					jetstream.WithMsgID(fmt.Sprintf("r1-%d/assigned", i)), jetstream.WithStallWait(10*time.Second)); err != nil {
					b.Fatal(err)
				}
			}
			<-bb.JS.PublishAsyncComplete()
			<-done
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkEventCycle measures one episode's events through GAUNTLET_EVENTS as the
// pipeline moves them: an async publish with a message id and an ended header, delivery
// to the store's consumer (whole messages) and to the scheduler's (headers only), and
// both acks. One op is one episode of 4.7 kB (a shop episode's encoded events); with
// batch=K an op is a K-th of a message carrying K episodes, as a worker's EventBatch does.
// It reports the process's CPU per op beside the wall time.
func BenchmarkEventCycle(b *testing.B) {
	for _, batch := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			_, bb := benchServer(b)
			ctx := context.Background()
			msgs := (b.N + batch - 1) / batch
			var dones []chan struct{}
			for _, c := range []struct {
				name, subject string
				headersOnly   bool
			}{{"store", "gauntlet.ev.>", false}, {"scheduler", SubjectEndedAll, true}} {
				cons, err := bb.JS.CreateOrUpdateConsumer(ctx, StreamEvents, jetstream.ConsumerConfig{
					Durable: c.name, FilterSubject: c.subject, HeadersOnly: c.headersOnly,
					AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 100_000,
				})
				if err != nil {
					b.Fatal(err)
				}
				done, got := make(chan struct{}), 0
				cc, err := cons.Consume(func(m jetstream.Msg) {
					_ = m.Ack()
					if got++; got == msgs {
						close(done)
					}
				}, jetstream.PullMaxMessages(500))
				if err != nil {
					b.Fatal(err)
				}
				defer cc.Stop()
				dones = append(dones, done)
			}
			data := make([]byte, 4700*batch)
			ends := make([]string, batch) // one EndedSummary header value per episode
			for i := range ends {
				ends[i] = "CiAKFnJhMmIzYzM3ZGJiZDgtMDAwMDAxMhIIcmEyYjNjMzcQBxgB"
			}
			cpu0 := cpuTime()
			b.ResetTimer()
			for i := 0; i < msgs; i++ {
				m := &nats.Msg{Subject: SubjectEvent(KindEnded, "r1"), Data: data, Header: nats.Header{HeaderEnded: ends}}
				if _, err := bb.JS.PublishMsgAsync(m, jetstream.WithMsgID(fmt.Sprintf("r1-%d/ended", i)),
					jetstream.WithStallWait(10*time.Second)); err != nil {
					b.Fatal(err)
				}
			}
			<-bb.JS.PublishAsyncComplete()
			for _, d := range dones {
				<-d
			}
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}
