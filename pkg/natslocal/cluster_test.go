package natslocal_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/natslocal"
	"github.com/gauntlet-rl/gauntlet/pkg/natslocal/natstest"
	"github.com/nats-io/nats.go/jetstream"
)

// A 3-node cluster holds gauntlet's streams at 3 replicas, keeps taking publishes and
// serving them while one node is down, and the node rejoins with the others' data.
func TestClusterSurvivesANode(t *testing.T) {
	c := natstest.Start(t, 3)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	b, err := bus.Connect(c.URL(), "test", log)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if v := b.NC.ConnectedServerVersion(); "v"+v != natslocal.Version() {
		t.Fatalf("cluster runs NATS %s, gauntlet embeds %s", v, natslocal.Version())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := bus.DefaultStreamConfig()
	cfg.Replicas = 3
	cfg.EventsMaxBytes = 64 << 20
	if err := b.EnsureStreams(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{bus.StreamCommands, bus.StreamEvents, "KV_" + bus.BucketRuns} {
		s, err := b.JS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
			t.Fatalf("stream %s: replicas %d, cluster %+v; want 3 replicas on 3 nodes", name, info.Config.Replicas, info.Cluster)
		}
	}
	// Publish as gauntlet does (bus.publishRetry): with a message id, asking again while
	// the stream elects a new leader after a node's loss ("no response from stream"),
	// for up to 30 s a message.
	publish := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			deadline := time.Now().Add(30 * time.Second)
			for {
				_, err := b.JS.Publish(ctx, "gauntlet.ev.steps.r1", []byte(fmt.Sprint(i)), jetstream.WithMsgID(fmt.Sprint(i)))
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("publish %d: %v", i, err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	publish(0, 100)
	// Kill the node the client is on, so the client must fail over as well.
	victim := -1
	for i := range c.Nodes() {
		if c.NodeURL(i) == b.NC.ConnectedUrl() {
			victim = i
		}
	}
	if victim < 0 {
		t.Fatalf("client on %s, none of the nodes", b.NC.ConnectedUrl())
	}
	if err := c.Kill(victim); err != nil {
		t.Fatal(err)
	}
	publish(100, 200)
	if err := c.Restart(ctx, victim); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	publish(200, 300)
	s, err := b.JS.Stream(ctx, bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 300 {
		t.Fatalf("events stream holds %d messages, want 300", info.State.Msgs)
	}
	for _, r := range info.Cluster.Replicas {
		if !r.Current {
			t.Errorf("replica %s is not current after the restart: %+v", r.Name, r)
		}
	}
}

func TestWrongVersionIsRefused(t *testing.T) {
	_, err := natslocal.Start(context.Background(), natslocal.Options{Dir: t.TempDir(), Binary: "true"})
	if !errors.Is(err, natslocal.ErrWrongVersion) {
		t.Fatalf("Start with a binary of no version: %v, want ErrWrongVersion", err)
	}
}
