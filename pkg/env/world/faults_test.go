package world

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
)

// goodTransfer returns the args of the transfer that pays a bank world's bill: from the
// one account that can pay, to the bill's payee, of its amount.
func goodTransfer(t *testing.T, ep env.Episode) string {
	t.Helper()
	return `{"from":"` + varOf(ep, "good_account").(string) + `","payee_id":"` + varOf(ep, "task_payee").(string) + `","amount":` + strconv.FormatInt(varOf(ep, "amount").(int64), 10) + `}`
}

// varOf reads a variable of an episode's state, as Go.
func varOf(ep env.Episode, name string) any {
	w := ep.(*episode)
	return w.vars[w.w.slots[name]].Value()
}

func newBank(t *testing.T, cfg env.Config) env.Episode {
	t.Helper()
	ep, err := bank(t).NewEpisode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ep.Reset(); err != nil {
		t.Fatal(err)
	}
	return ep
}

func mustStep(t *testing.T, ep env.Episode, tool, args string) env.StepResult {
	t.Helper()
	r, err := ep.Step(env.Action{Tool: tool, Args: json.RawMessage(args)})
	if err != nil {
		t.Fatalf("%s %s: %v", tool, args, err)
	}
	return r
}

// TestInjectedErrorsAndRetryAfter: an injected error answers the call and changes
// nothing but the service's health; calling the service again before its Retry-After
// has passed is the respect_retry_after violation; after a wait the call goes through.
func TestInjectedErrorsAndRetryAfter(t *testing.T) {
	ep := newBank(t, env.Config{Seed: 5, Faults: injector(t, 1, httpErr("down", "transfer.create", 1, 503, 300))})
	args := goodTransfer(t, ep)
	r := mustStep(t, ep, "transfer.create", args)
	if got := string(r.Observation); got != `{"ok":false,"status":503,"error":"service unavailable","retry_after_ms":300}` {
		t.Fatalf("observation %s", got)
	}
	if !strings.HasPrefix(string(r.Diff), `[{"op":"set","path":"services/payments/unavailable_until_ns","from":0,"to":`) || strings.Contains(string(r.Diff), "transfer/") {
		t.Fatalf("diff %s: want the service's health alone", r.Diff)
	}
	if len(r.Faults) != 1 || r.Faults[0].GetFaultId() != "down" || r.Metering.GetErrors() != 1 {
		t.Fatalf("faults %v, metering %v", r.Faults, r.Metering)
	}
	before := ep.Now()
	r = mustStep(t, ep, "limits.get", "")
	if len(r.Signals.GetViolations()) != 1 || r.Signals.GetViolations()[0].GetRule() != RuleRespectRetryAfter ||
		!strings.Contains(string(r.Observation), `"rule":"respect_retry_after","reason":"payments is unavailable for another`) {
		t.Fatalf("a call to the service while it is down: %s %v", r.Observation, r.Signals)
	}
	if ep.Now() <= before {
		t.Fatal("a refused call took no virtual time")
	}
	mustStep(t, ep, "wait", `{"ms":400}`)
	r = mustStep(t, ep, "limits.get", "")
	if !strings.HasPrefix(string(r.Observation), `{"ok":true,"daily_limit":`) {
		t.Fatalf("after the wait: %s", r.Observation)
	}
}

// TestTruncatedWriteHappened: a truncated answer cuts the body, but the write it
// answers happened: the state diff, the spend and the progress say so.
func TestTruncatedWriteHappened(t *testing.T) {
	ep := newBank(t, env.Config{Seed: 5, Faults: injector(t, 1, truncate("cut", "transfer.create", 1, 0.25))})
	r := mustStep(t, ep, "transfer.create", goodTransfer(t, ep))
	if !strings.HasPrefix(string(r.Observation), `{"truncated":true,"body":"{\"ok\":true`) {
		t.Fatalf("observation %s", r.Observation)
	}
	if !strings.Contains(string(r.Diff), `{"op":"add","path":"transfer/t-1","to":{"from":`) || r.Signals.GetSpend() == 0 || r.Signals.GetProgress() == 0 {
		t.Fatalf("diff %s, signals %v: the write did not count", r.Diff, r.Signals)
	}
}

// TestLatencyMovesTheClock: an injected latency is added to the call's virtual time.
func TestLatencyMovesTheClock(t *testing.T) {
	plain := newBank(t, env.Config{Seed: 9})
	slow := newBank(t, env.Config{Seed: 9, Faults: injector(t, 1, latency("lat", "accounts", 1, 500, 0))})
	a := mustStep(t, plain, "account.list", "")
	b := mustStep(t, slow, "account.list", "")
	if d := time.Duration(b.Metering.GetVirtualNs() - a.Metering.GetVirtualNs()); d < 400*time.Millisecond || d > 600*time.Millisecond {
		t.Fatalf("the latency fault added %v to the call, want about 500ms", d)
	}
	if string(a.Observation) != string(b.Observation) {
		t.Fatal("latency changed the answer")
	}
}

// TestPolicyRulesSayWhy: each policy rule refuses with its reason and suggestion, as a
// causal violation, and changes nothing.
func TestPolicyRulesSayWhy(t *testing.T) {
	ep := newBank(t, env.Config{Seed: 5})
	r := mustStep(t, ep, "transfer.create", `{"from":"`+varOf(ep, "good_account").(string)+`","payee_id":"p-1","amount":1000000}`)
	v := r.Signals.GetViolations()
	if len(v) != 1 || v[0].GetRule() != "sufficient_funds" || !strings.Contains(v[0].GetReason(), "short of 1000000") || v[0].GetSuggestion() == "" || string(r.Diff) != "[]" {
		t.Fatalf("over the balance: %s %v %s", r.Observation, v, r.Diff)
	}
	r = mustStep(t, ep, "fraud.verify", `{"transfer_id":"t-1","code":"1"}`)
	if len(r.Signals.GetViolations()) != 0 || !strings.Contains(string(r.Observation), `"error":"unknown transfer"`) {
		t.Fatalf("an unknown id is a plain error, not a violation: %s %v", r.Observation, r.Signals)
	}
}
