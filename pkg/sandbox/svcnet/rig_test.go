package svcnet_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/svcnet"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
)

// egressRig is the set-up every egress test shares: a sandbox of one runtime whose only
// service is an egress gateway, the gateway attached with a decider, what it records,
// and a shell in the sandbox.
type egressRig struct {
	t   *testing.T
	rt  sandbox.Runtime
	h   sandbox.Handle
	rec *svcnet.Recorder
	g   *svcnet.Gateway
	tb  *tools.Toolbox
}

// newEgressRig creates a sandbox of image on rt with egress service svc (its name,
// port and protocol filled in), destroyed when the test ends. attach opens its gateway.
func newEgressRig(t *testing.T, rt sandbox.Runtime, image string, svc sandbox.Service) *egressRig {
	t.Helper()
	svc.Name, svc.Port, svc.Protocol = "egress", 80, sandbox.ProtocolEgress
	h, err := rt.Create(context.Background(), sandbox.Spec{Image: image, Services: []sandbox.Service{svc}})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { _ = rt.Destroy(context.Background(), h.ID) })
	r := &egressRig{t: t, rt: rt, h: h, rec: &svcnet.Recorder{}, tb: tools.New(rt, h.ID, tools.Options{})}
	t.Cleanup(func() {
		if r.g != nil {
			_ = r.g.Close()
		}
	})
	return r
}

// attach opens the sandbox's gateway with decider d, recording into the rig's recorder,
// after closing the one open before (a replay starts on a new gateway); its Settle waits
// up to an hour.
func (r *egressRig) attach(d *inject.Decider) {
	r.t.Helper()
	if r.g != nil {
		if err := r.g.Close(); err != nil {
			r.t.Fatalf("close gateway: %v", err)
		}
	}
	// An hour's bound: a Settle that waits for nothing hangs the test instead of costing
	// each command a second unseen.
	g, err := svcnet.Attach(context.Background(), r.rt, r.h.ID, r.h.Spec.Services, svcnet.Options{Decider: d, OnFire: r.rec.OnFire, OnRequest: r.rec.OnRequest, SettleWait: time.Hour})
	if err != nil {
		r.t.Fatalf("attach: %v", err)
	}
	r.g = g
}

// sh runs cmd in the sandbox (within a minute), settles the gateway, and says how long
// the command took.
func (r *egressRig) sh(cmd string) (tools.ExecResult, time.Duration) {
	r.t.Helper()
	args, _ := json.Marshal(tools.ExecArgs{Command: cmd, TimeoutMS: 60000})
	start := time.Now()
	out, err := r.tb.Call(context.Background(), "shell.exec", args)
	took := time.Since(start)
	if err != nil {
		r.t.Fatalf("shell.exec %q: %v", cmd, err)
	}
	var res tools.ExecResult
	if err := json.Unmarshal(out, &res); err != nil {
		r.t.Fatal(err)
	}
	if r.g != nil {
		// As an env does at the end of a step: what the command did is recorded now.
		r.g.Settle(context.Background())
	}
	return res, took
}

// requests returns the requests recorded since the last call, once the gateway has
// settled (Gateway.Settle): every connection the sandbox's command made and ended is
// recorded by then, however late the gateway's goroutines came to it; n is how many the
// caller expects, checked by the caller.
func (r *egressRig) requests(n int) []svcnet.Request {
	_ = n
	r.g.Settle(context.Background())
	return r.rec.TakeRequests()
}

// rulesOf compiles a profile spec's rules.
func rulesOf(t *testing.T, profile string) []catalogue.Rule {
	t.Helper()
	_, rules, err := plans.ParseSpec([]byte(profile))
	if err != nil {
		t.Fatal(err)
	}
	return rules
}
