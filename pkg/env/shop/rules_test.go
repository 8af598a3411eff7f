package shop

import (
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/faulttest"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// find returns the first product index satisfying ok, failing the test when none does.
func find(t *testing.T, w *world, ok func(i int) bool) int {
	t.Helper()
	for i := range w.products {
		if ok(i) {
			return i
		}
	}
	t.Fatal("no product satisfies the test's condition")
	return -1
}

func decode(t *testing.T, raw json.RawMessage) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("observation %s: %v", raw, err)
	}
	return m
}

type sku struct {
	SKU string `json:"sku"`
	Qty int64  `json:"qty,omitempty"`
}

type oid struct {
	OrderID string `json:"order_id"`
}

func TestCausalRules(t *testing.T) {
	tests := []struct {
		name string
		// play acts on a fresh episode and returns the step that must break the rule.
		play       func(t *testing.T, ep *episode) env.StepResult
		rule       string
		reason     string
		suggestion string
	}{
		{
			name: "pay an order whose stock is short",
			play: func(t *testing.T, ep *episode) env.StepResult {
				i := find(t, &ep.w, func(i int) bool { return ep.w.stock[i] < 50 })
				step(t, ep, "order.create", sku{ep.w.products[i].sku, ep.w.stock[i] + 2})
				ep.w.balance = 1 << 40 // only the stock rule may fail
				return step(t, ep, "payment.pay", oid{"o-1"})
			},
			rule: RuleInventoryBeforePayment, reason: "2 items short", suggestion: "query inventory.get first",
		},
		{
			name: "pay more than the balance",
			play: func(t *testing.T, ep *episode) env.StepResult {
				i := find(t, &ep.w, ep.w.good)
				step(t, ep, "order.create", sku{ep.w.products[i].sku, 1})
				ep.w.balance = 0
				return step(t, ep, "payment.pay", oid{"o-1"})
			},
			rule: RuleSufficientBalance, reason: "is " /* "balance 0 is N short of N" */, suggestion: "wallet.balance",
		},
		{
			name: "ship before paying",
			play: func(t *testing.T, ep *episode) env.StepResult {
				step(t, ep, "order.create", sku{ep.w.products[0].sku, 1})
				return step(t, ep, "shipping.ship", oid{"o-1"})
			},
			rule: RuleShipBeforePayment, reason: "order o-1 is not paid", suggestion: "payment.pay",
		},
		{
			name: "pay an order that does not exist",
			play: func(t *testing.T, ep *episode) env.StepResult {
				return step(t, ep, "payment.pay", oid{"o-9"})
			},
			rule: RuleOrderExists, reason: `no order "o-9" exists`, suggestion: "order.create",
		},
		{
			name: "pay twice",
			play: func(t *testing.T, ep *episode) env.StepResult {
				ep.w.balance, ep.w.task.budget = 1<<40, 1<<40
				i := find(t, &ep.w, func(i int) bool { return ep.w.stock[i] > 0 && !ep.w.matches(i) })
				step(t, ep, "order.create", sku{ep.w.products[i].sku, 1})
				if r := step(t, ep, "payment.pay", oid{"o-1"}); r.Done() || r.Signals.Spend == 0 {
					t.Fatalf("first payment: %s", r.Observation)
				}
				return step(t, ep, "payment.pay", oid{"o-1"})
			},
			rule: RulePayOnce, reason: "order o-1 is already paid", suggestion: "order.status",
		},
		{
			name: "ship twice",
			play: func(t *testing.T, ep *episode) env.StepResult {
				ep.w.balance, ep.w.task.budget = 1<<40, 1<<40
				i := find(t, &ep.w, func(i int) bool { return ep.w.stock[i] > 0 && !ep.w.matches(i) })
				step(t, ep, "order.create", sku{ep.w.products[i].sku, 1})
				step(t, ep, "payment.pay", oid{"o-1"})
				if r := step(t, ep, "shipping.ship", oid{"o-1"}); r.Done() {
					t.Fatalf("shipping an order that does not fulfil the task ended the episode: %v", r.Reason)
				}
				return step(t, ep, "shipping.ship", oid{"o-1"})
			},
			rule: RuleShipOnce, reason: "order o-1 is already shipped", suggestion: "order.status",
		},
		{
			name: "call a service before its Retry-After passed",
			play: func(t *testing.T, ep *episode) env.StepResult {
				ep.cfg.Faults = faulttest.Injector(t, 1, faulttest.HTTPError("down", "payment", 1, 503, 500))
				r := step(t, ep, "wallet.balance", nil)
				if len(r.Faults) != 1 || len(r.Signals.Violations) != 0 || !strings.Contains(string(r.Observation), `"retry_after_ms":500`) {
					t.Fatalf("injected 503: faults %v violations %v obs %s", r.Faults, r.Signals.Violations, r.Observation)
				}
				return step(t, ep, "payment.pay", oid{"o-1"})
			},
			rule: RuleRespectRetryAfter, reason: "payment is unavailable for another", suggestion: "wait",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ep, _ := newEp(t, env.Config{Seed: 42})
			r := tt.play(t, ep)
			obs := decode(t, r.Observation)
			if obs["ok"] != false || obs["rule"] != tt.rule ||
				!strings.Contains(obs["reason"].(string), tt.reason) || !strings.Contains(obs["suggestion"].(string), tt.suggestion) {
				t.Errorf("observation %s, want rule %q with reason ~%q and suggestion ~%q", r.Observation, tt.rule, tt.reason, tt.suggestion)
			}
			v := r.Signals.GetViolations()
			if len(v) != 1 || v[0].Rule != tt.rule || v[0].Reason != obs["reason"] || v[0].Suggestion != obs["suggestion"] {
				t.Errorf("violations %v, want one %q matching the observation", v, tt.rule)
			}
			if string(r.Diff) != "[]" || r.Signals.Spend != 0 || r.Signals.InvalidAction || r.Done() {
				t.Errorf("a broken rule changed something: diff %s spend %v invalid %v done %v", r.Diff, r.Signals.Spend, r.Signals.InvalidAction, r.Done())
			}
			if r.Metering.Errors != 1 || r.Metering.ToolCalls != 1 {
				t.Errorf("metering %v, want 1 call and 1 error", r.Metering)
			}
		})
	}
}

func TestInvalidActions(t *testing.T) {
	tests := []struct {
		tool, args string
		want       string
	}{
		{"teleport", `{}`, `unknown tool \"teleport\"`},
		{"order.create", `{"sku":"sku-1","qty":`, "args: malformed JSON"},
		{"order.create", `{"sku":"sku-1","qty":"2"}`, "args.qty: want integer, got string"},
		{"order.create", `{"sku":"sku-1","qty":2.5}`, "args.qty: want integer, got number 2.5"},
		{"order.create", `{"sku":"sku-1","qty":0}`, "args.qty: 0 is outside [1,1000]"},
		{"order.create", `{"sku":"sku-1"}`, "args.qty: required"},
		{"order.create", `{"sku":7,"qty":1}`, "args.sku: want string, got number"},
		{"order.create", `{"sku":"sku-1","qty":1,"colour":"red"}`, "args.colour: unknown field"},
		{"order.create", `[1,2]`, "args: want object, got array"},
		{"catalog.search", `{"query":"` + strings.Repeat("a", 300) + `"}`, "args.query: 300 bytes exceeds the limit of 200"},
		{"catalog.search", `{"query":"` + strings.Repeat("a", env.MaxArgsBytes) + `"}`, "args: 65548 bytes exceeds the limit of 65536"},
		{"wait", `{"ms":20000}`, "args.ms: 20000 is outside [1,10000]"},
		{"wait", `{"ms":null}`, "args.ms: want integer, got null"},
		{"wallet.balance", `{"x":{"y":[1]}}`, "args.x: unknown field"},
	}
	ep, _ := newEp(t, env.Config{Seed: 3, Params: json.RawMessage(`{"max_invalid":100}`)})
	for _, tt := range tests {
		before := ep.Now()
		r := step(t, ep, tt.tool, tt.args)
		if !strings.Contains(string(r.Observation), tt.want) {
			t.Errorf("%s %.40s: observation %.300s, want it to contain %q", tt.tool, tt.args, r.Observation, tt.want)
		}
		if !r.Signals.InvalidAction || r.Metering.ToolCalls != 0 || r.Metering.Errors != 1 || r.Done() ||
			string(r.Diff) != "[]" || ep.Now() != before || len(r.Observation) > 600 {
			t.Errorf("%s %.40s: invalid %v, metering %v, done %v, diff %s, %d bytes", tt.tool, tt.args,
				r.Signals.InvalidAction, r.Metering, r.Done(), r.Diff, len(r.Observation))
		}
	}
	// The episode goes on after invalid actions.
	if r := step(t, ep, "wallet.balance", nil); r.Signals.InvalidAction || !strings.Contains(string(r.Observation), `"ok":true`) {
		t.Errorf("valid action after invalid ones: %s", r.Observation)
	}
}

func TestEpisodeEnds(t *testing.T) {
	reason := func(r env.StepResult) gauntletv1.TerminationReason { return r.Reason }
	t.Run("invalid action limit", func(t *testing.T) {
		ep, _ := newEp(t, env.Config{Seed: 1, Params: json.RawMessage(`{"max_invalid":3}`)})
		for i := range 3 {
			r := step(t, ep, "nope", nil)
			if done := i == 2; r.Terminated != done || r.Done() != done {
				t.Fatalf("invalid action %d: terminated %v", i+1, r.Terminated)
			}
		}
		if _, err := ep.Step(env.Action{Tool: "wallet.balance"}); !errors.Is(err, ErrEpisodeOver) {
			t.Errorf("Step after the end: %v", err)
		}
	})
	t.Run("max steps", func(t *testing.T) {
		ep, _ := newEp(t, env.Config{Seed: 1, MaxSteps: 4})
		var r env.StepResult
		for range 4 {
			r = step(t, ep, "wallet.balance", nil)
		}
		if !r.Truncated || r.Terminated || reason(r) != gauntletv1.TerminationReason_TERMINATION_REASON_MAX_STEPS {
			t.Errorf("after 4 of 4 steps: %+v", r)
		}
	})
	t.Run("default max steps", func(t *testing.T) {
		ep, _ := newEp(t, env.Config{Seed: 1})
		for i := range DefaultMaxSteps {
			if r := step(t, ep, "wallet.balance", nil); r.Done() != (i == DefaultMaxSteps-1) {
				t.Fatalf("step %d: done %v", i, r.Done())
			}
		}
	})
	t.Run("deadline", func(t *testing.T) {
		ep, _ := newEp(t, env.Config{Seed: 1, Params: json.RawMessage(`{"deadline_ms":1000}`)})
		if r := step(t, ep, "wait", `{"ms":1000}`); r.Done() || r.Metering.VirtualNs != 1e9 {
			t.Fatalf("at the deadline: done %v, virtual_ns %d", r.Done(), r.Metering.VirtualNs)
		}
		r := step(t, ep, "wallet.balance", nil)
		if !r.Truncated || reason(r) != gauntletv1.TerminationReason_TERMINATION_REASON_TIMEOUT {
			t.Errorf("past the deadline: %v %v", r.Truncated, r.Reason)
		}
		if r.Signals.DeadlineVirtualNs != 1e9 {
			t.Errorf("deadline_virtual_ns %d", r.Signals.DeadlineVirtualNs)
		}
	})
	t.Run("overspending fails", func(t *testing.T) {
		ep, _ := newEp(t, env.Config{Seed: 5})
		ep.w.balance = 1 << 40
		i := find(t, &ep.w, func(i int) bool { return ep.w.stock[i] > 0 && ep.w.products[i].price > ep.w.task.budget })
		step(t, ep, "order.create", sku{ep.w.products[i].sku, 1})
		r := step(t, ep, "payment.pay", oid{"o-1"})
		if !r.Terminated || reason(r) != gauntletv1.TerminationReason_TERMINATION_REASON_FAILURE || r.Signals.Spend != float64(ep.w.products[i].price) {
			t.Errorf("paying more than the budget: %v %v spend %v", r.Terminated, r.Reason, r.Signals.Spend)
		}
	})
	t.Run("too little left fails", func(t *testing.T) {
		ep, _ := newEp(t, env.Config{Seed: 5})
		g := find(t, &ep.w, ep.w.good)
		need := ep.w.products[g].price * ep.w.task.qty
		// Leave the wallet with less than the good order costs after one cheap purchase.
		i := find(t, &ep.w, func(i int) bool { return ep.w.stock[i] > 0 && !ep.w.matches(i) })
		ep.w.balance = need - 1 + ep.w.products[i].price
		step(t, ep, "order.create", sku{ep.w.products[i].sku, 1})
		r := step(t, ep, "payment.pay", oid{"o-1"})
		if !r.Terminated || reason(r) != gauntletv1.TerminationReason_TERMINATION_REASON_FAILURE {
			t.Errorf("balance below every remaining option: %v %v %s", r.Terminated, r.Reason, r.Observation)
		}
	})
	// Step before Reset: the conformance suite (envtest_test.go).
}

func TestSuccessPathSignalsAndDiffs(t *testing.T) {
	ep, first := newEp(t, env.Config{Seed: 11})
	task := decode(t, first)
	for _, k := range []string{"task", "item", "category", "qty", "budget", "balance", "deadline_ms", "tools"} {
		if _, ok := task[k]; !ok {
			t.Errorf("first observation lacks %q: %s", k, first)
		}
	}
	g := find(t, &ep.w, ep.w.good)
	p, q := ep.w.products[g], ep.w.task.qty
	stock, bal := ep.w.stock[g], ep.w.balance
	want := []struct {
		tool     string
		args     any
		progress float64
		diff     string
	}{
		{"catalog.search", map[string]string{"query": ep.w.task.noun}, 0.2, `[]`},
		{"wallet.balance", nil, 0.2, `[]`},
		{"inventory.get", sku{SKU: p.sku}, 0.4, `[]`},
		{"order.create", sku{p.sku, q}, 0.6, `[{"op":"add","path":"orders/o-1","to":{"sku":"` + p.sku + `","qty":` + itoa(q) + `,"amount":` + itoa(p.price*q) + `,"status":"created"}}]`},
		{"payment.pay", oid{"o-1"}, 0.8, `[{"op":"set","path":"orders/o-1/status","from":"created","to":"paid"},` +
			`{"op":"set","path":"inventory/` + p.sku + `/stock","from":` + itoa(stock) + `,"to":` + itoa(stock-q) + `},` +
			`{"op":"set","path":"wallet/balance","from":` + itoa(bal) + `,"to":` + itoa(bal-p.price*q) + `}]`},
		{"shipping.ship", oid{"o-1"}, 1, `[{"op":"set","path":"orders/o-1/status","from":"paid","to":"shipped"}]`},
	}
	prev := 0.0
	for i, w := range want {
		r := step(t, ep, w.tool, w.args)
		if r.Signals.Progress != w.progress || math.Abs(r.Signals.ProgressDelta-(w.progress-prev)) > 1e-9 {
			t.Errorf("%s: progress %v (delta %v), want %v", w.tool, r.Signals.Progress, r.Signals.ProgressDelta, w.progress)
		}
		if string(r.Diff) != w.diff {
			t.Errorf("%s: diff\n%s\nwant\n%s", w.tool, r.Diff, w.diff)
		}
		if r.Metering.BytesOut != uint32(len(r.Observation)) || r.Metering.VirtualNs == 0 || r.Metering.ToolCalls != 1 {
			t.Errorf("%s: metering %v", w.tool, r.Metering)
		}
		if last := i == len(want)-1; r.Done() != last || r.Signals.Success != last {
			t.Errorf("%s: done %v success %v", w.tool, r.Done(), r.Signals.Success)
		}
		if w.tool == "payment.pay" && r.Signals.Spend != float64(p.price*q) {
			t.Errorf("spend %v, want %d", r.Signals.Spend, p.price*q)
		}
		prev = w.progress
	}
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

func TestFaultEffects(t *testing.T) {
	t.Run("truncation keeps valid JSON and a prefix of the body", func(t *testing.T) {
		clean, _ := newEp(t, env.Config{Seed: 9})
		cut, _ := newEp(t, env.Config{Seed: 9, Faults: faulttest.Injector(t, 1, faulttest.Truncate("t", "catalog.search", 1, 0.5))})
		q := map[string]string{"query": clean.w.task.noun}
		full, part := step(t, clean, "catalog.search", q), step(t, cut, "catalog.search", q)
		var tr truncObs
		if err := json.Unmarshal(part.Observation, &tr); err != nil || !tr.Truncated {
			t.Fatalf("truncated observation %s: %v", part.Observation, err)
		}
		if len(tr.Body) != len(full.Observation)/2 || !strings.HasPrefix(string(full.Observation), tr.Body) {
			t.Errorf("body %q is not the first half of %s", tr.Body, full.Observation)
		}
		if part.Signals.Progress != 0 || len(part.Faults) != 1 || part.Faults[0].Kind != "truncate" {
			t.Errorf("truncated read: progress %v faults %v", part.Signals.Progress, part.Faults)
		}
	})
	t.Run("abort has no effect", func(t *testing.T) {
		ep, _ := newEp(t, env.Config{Seed: 9, Faults: faulttest.Injector(t, 1, faulttest.HTTPError("p", "payment.pay", 1, 503, 200))})
		g := find(t, &ep.w, ep.w.good)
		step(t, ep, "order.create", sku{ep.w.products[g].sku, ep.w.task.qty})
		bal, stock := ep.w.balance, ep.w.stock[g]
		r := step(t, ep, "payment.pay", oid{"o-1"})
		want := `{"ok":false,"status":503,"error":"service unavailable","retry_after_ms":200}`
		if string(r.Observation) != want || ep.w.balance != bal || ep.w.stock[g] != stock || ep.orders[0].status != statusCreated {
			t.Errorf("aborted payment: %s, balance %d->%d", r.Observation, bal, ep.w.balance)
		}
		if !strings.HasPrefix(string(r.Diff), `[{"op":"set","path":"services/payment/unavailable_until_ns"`) || r.Metering.Errors != 1 {
			t.Errorf("aborted payment: diff %s metering %v", r.Diff, r.Metering)
		}
	})
	t.Run("latency moves the virtual clock", func(t *testing.T) {
		slow, _ := newEp(t, env.Config{Seed: 9, Faults: faulttest.Injector(t, 1, faulttest.Latency("l", "*", 1, 500, 0))})
		fast, _ := newEp(t, env.Config{Seed: 9})
		a, b := step(t, slow, "wallet.balance", nil), step(t, fast, "wallet.balance", nil)
		if a.Metering.VirtualNs-b.Metering.VirtualNs != 500e6 || slow.Now() != time.Duration(a.Metering.VirtualNs) {
			t.Errorf("virtual_ns %d with 500 ms latency vs %d without", a.Metering.VirtualNs, b.Metering.VirtualNs)
		}
	})
}

func TestParams(t *testing.T) {
	tests := []struct {
		params string
		want   []string // substrings of the error; none: valid
	}{
		{``, nil},
		{`null`, nil},
		{`{}`, nil},
		{`{"products":2,"qty_max":1,"deadline_ms":100,"max_invalid":1}`, nil},
		{`{"products":200}`, nil},
		{`{"products":500}`, []string{"params.products: 500 is outside [2,200]"}},
		{`{"products":"many"}`, []string{"params.products: want integer, got string"}},
		{`{"productz":3}`, []string{"params.productz: unknown parameter (known: deadline_ms, max_invalid, products, qty_max)"}},
		{`{"qty_max":0,"deadline_ms":-1,"max_invalid":true}`, []string{"params.qty_max: 0 is outside", "params.deadline_ms: -1 is outside", "params.max_invalid: want integer, got boolean"}},
		{`[1]`, []string{"params: want object, got array"}},
		{`{"products":`, []string{"params: malformed JSON"}},
	}
	for _, tt := range tests {
		_, err := New().NewEpisode(env.Config{Params: json.RawMessage(tt.params)})
		if (err == nil) != (tt.want == nil) {
			t.Errorf("params %s: error %v", tt.params, err)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("params %s: error %q lacks %q", tt.params, err, w)
			}
		}
	}
}

func TestSpecAndRegistry(t *testing.T) {
	e, err := env.Lookup(Name)
	if err != nil {
		t.Fatal(err)
	}
	s := e.Spec()
	if s.Name != Name || s.DefaultMaxSteps != DefaultMaxSteps || len(s.Tools) != len(toolDefs) || len(s.Params) != len(paramDefs) {
		t.Fatalf("spec %+v", s)
	}
	for _, tool := range s.Tools {
		var schema struct {
			Type       string                     `json:"type"`
			Properties map[string]json.RawMessage `json:"properties"`
		}
		if err := json.Unmarshal(tool.Schema, &schema); err != nil || schema.Type != "object" {
			t.Errorf("%s: schema %s: %v", tool.Name, tool.Schema, err)
		}
		if tool.Service != "" && !slices.Contains(s.Services, tool.Service) {
			t.Errorf("%s: service %q not in Spec.Services %v", tool.Name, tool.Service, s.Services)
		}
		if tool.Description == "" {
			t.Errorf("%s: no description", tool.Name)
		}
	}
	// That Spec is the caller's copy: the conformance suite (envtest_test.go).
	if _, ok := e.(env.Oracle); !ok {
		t.Error("shop has no oracle")
	}
}
