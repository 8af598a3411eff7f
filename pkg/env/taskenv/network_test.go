package taskenv_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/taskenv"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/svcnet"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
	"github.com/gauntlet-rl/gauntlet/pkg/tasks/taskstest"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// netStep is what one step of an allowlist task recorded about the network.
type netStep struct {
	obs    string
	reqs   []svcnet.Request
	faults []*gauntletv1.FaultFired
}

// playNet plays agent on net/latest-release with the plan's faults and returns each
// step's network record and the last step.
func playNet(t *testing.T, sb env.Sandboxes, plan *gauntletv1.FaultPlan, agent env.Agent) ([]netStep, env.StepResult) {
	t.Helper()
	in, err := inject.NewInjector(plan)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := taskenv.New().NewEpisode(env.Config{Seed: 1, Params: params("net/latest-release"), Sandboxes: sb, Datasets: gauntlet, Faults: in})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close(ep)
	obs, err := ep.Reset()
	if err != nil {
		t.Fatal(err)
	}
	var steps []netStep
	for i := range 20 {
		a, err := agent.Act(env.Turn{Step: uint32(i), Observation: obs})
		if err != nil {
			t.Fatal(err)
		}
		res, err := ep.Step(a)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		var entries []struct{ Net svcnet.Request }
		if err := json.Unmarshal(res.Diff, &entries); err != nil {
			t.Fatalf("step %d: diff %s: %v", i, res.Diff, err)
		}
		s := netStep{obs: string(res.Observation), faults: res.Faults}
		for _, e := range entries {
			s.reqs = append(s.reqs, e.Net)
		}
		steps = append(steps, s)
		if res.Done() {
			return steps, res
		}
		obs = res.Observation
	}
	t.Fatal("the episode did not end")
	return nil, env.StepResult{}
}

// TestAllowedHosts: an allowlist task's agent reaches its allowed host by name through
// gauntlet's proxy, where the plan's rules for the egress service fire; every request is
// in the step's diff with the faults it met, and the faults in the step's faults, on the
// host. Other hosts and names are refused at once and recorded as denied, and the host's
// real address is unreachable.
func TestAllowedHosts(t *testing.T) {
	c := runtimestest.Config(t, runtimes.Process) // serves the allowed host
	addr := c.Hosts[taskstest.ReleasesHost]
	sb := runtimestest.OpenConfig(t, c)
	// Under seed 3 the oracle's first request meets the 503 and a retry gets through.
	plan := &gauntletv1.FaultPlan{Profile: "custom", Seed: 3, Rules: []*gauntletv1.FaultRule{
		{Id: "egress.http_503", Target: taskenv.EgressService, Probability: 0.5,
			Spec: &gauntletv1.FaultRule_HttpError{HttpError: &gauntletv1.HTTPErrorFault{Status: 503}}},
	}}

	// The oracle retries what fails and solves the task; its requests are recorded.
	steps, last := playNet(t, sb, plan, taskenv.New().(env.Oracle).Oracle(1))
	if !last.Signals.Success {
		t.Fatalf("oracle: %s", last.Observation)
	}
	var ok, failed, faults int
	for _, s := range steps {
		for _, r := range s.reqs {
			if r.Host != taskstest.ReleasesHost || r.Method != "GET" || r.Path != "/v1/widget/releases.json" || r.Denied {
				t.Errorf("oracle request %+v", r)
			}
			switch {
			case r.Status == 200 && r.Bytes == int64(len(taskstest.ReleasesIndex)) && len(r.Faults) == 0:
				ok++
			case r.Status == 503 && len(r.Faults) == 1 && r.Faults[0] == "http_error":
				failed++
			default:
				t.Errorf("oracle request %+v", r)
			}
		}
		for _, f := range s.faults {
			if f.FaultId == "egress.http_503" {
				faults++
				if f.Target != taskstest.ReleasesHost || !strings.Contains(f.Detail, "on GET /v1/widget/releases.json") {
					t.Errorf("fault recorded as %v", f)
				}
			}
		}
	}
	if ok != 1 || failed == 0 || faults != failed {
		t.Errorf("oracle: %d answered, %d met a 503, %d faults recorded: want one answer after at least one 503, each recorded", ok, failed, faults)
	}

	// An agent that looks elsewhere is refused at once, and the record says so.
	steps, _ = playNet(t, sb, plan, &scripted{actions: []env.Action{
		act(tools.ShellExec, map[string]any{"command": `busybox wget -q -O- http://pypi.org/simple/ ; echo rc=$?
printf 'GET /simple/ HTTP/1.0\r\nHost: pypi.org\r\n\r\n' | busybox nc 127.0.0.1 80
busybox wget -T 3 -q -O- http://` + addr + `/v1/widget/releases.json ; echo rc=$?`}),
	}})
	s := steps[0]
	if strings.Count(s.obs, "rc=1") != 2 || !strings.Contains(s.obs, `host \"pypi.org\" is not allowed in this sandbox (allowed hosts: releases.example.test)`) || strings.Contains(s.obs, "widget") {
		t.Errorf("elsewhere: %s", s.obs)
	}
	var lookup, request bool
	for _, r := range s.reqs {
		switch {
		case r.Host == "pypi.org" && r.Method == svcnet.MethodDNS && r.Denied:
			lookup = true
		case r.Host == "pypi.org" && r.Method == "GET" && r.Path == "/simple/" && r.Status == 403 && r.Denied:
			request = true
		case r.Host == "pypi.org" && r.Method == svcnet.MethodDNS:
		default:
			t.Errorf("elsewhere: recorded %+v", r)
		}
	}
	if !lookup || !request {
		t.Errorf("elsewhere: recorded %+v, want pypi.org's lookup and request denied", s.reqs)
	}
}
