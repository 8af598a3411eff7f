package natslocal_test

import (
	"context"
	"errors"
	"fmt"
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
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b := natstest.Bus(ctx, t, c, 3, 64<<20)
	if v := b.NC.ConnectedServerVersion(); "v"+v != natslocal.Version() {
		t.Fatalf("cluster runs NATS %s, gauntlet embeds %s", v, natslocal.Version())
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
	// for up to 60 s a message.
	publish := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			deadline := time.Now().Add(60 * time.Second)
			for attempt := 1; ; attempt++ {
				actx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := b.JS.Publish(actx, "gauntlet.ev.steps.r1", []byte(fmt.Sprint(i)), jetstream.WithMsgID(fmt.Sprint(i)))
				cancel()
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					var cluster any
					ictx, icancel := context.WithTimeout(context.Background(), 5*time.Second)
					if st, err := b.JS.Stream(ictx, bus.StreamEvents); err == nil {
						if info, err := st.Info(ictx); err == nil {
							cluster = info.Cluster
						} else {
							cluster = err
						}
					} else {
						cluster = err
					}
					icancel()
					t.Fatalf("publish %d: %d attempts in 60 s, the last: %v (client on %q, status %v; stream cluster %+v)", i, attempt, err, b.NC.ConnectedUrl(), b.NC.Status(), cluster)
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
	// The restarted node catches up from the others: current within seconds.
	for caughtUp := time.Now().Add(30 * time.Second); ; {
		behind := ""
		for _, r := range info.Cluster.Replicas {
			if !r.Current {
				behind += fmt.Sprintf(" %+v", r)
			}
		}
		if behind == "" {
			break
		}
		if time.Now().After(caughtUp) {
			t.Fatalf("replicas not current 30 s after the restart:%s", behind)
		}
		time.Sleep(200 * time.Millisecond)
		if info, err = s.Info(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func TestWrongVersionIsRefused(t *testing.T) {
	_, err := natslocal.Start(context.Background(), natslocal.Options{Dir: t.TempDir(), Binary: "true"})
	if !errors.Is(err, natslocal.ErrWrongVersion) {
		t.Fatalf("Start with a binary of no version: %v, want ErrWrongVersion", err)
	}
}
