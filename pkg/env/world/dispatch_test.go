package world

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/envtest"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

func dispatch(t testing.TB) env.Env {
	t.Helper()
	e, err := env.Lookup("dispatch")
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// dispatchStress hits every service of the dispatch world, the radio included: its
// messages are lost, delayed and cut.
func dispatchStress(t testing.TB, seed uint64) env.Config {
	return env.Config{Seed: seed, Faults: injector(t, rng.Derive(seed, "plan"),
		httpErr("radio-lost", "radio", 0.25, 503, 0),
		truncate("radio-cut", "radio", 0.1, 0.5),
		latency("radio-slow", "radio", 0.3, 400, 200),
		httpErr("fleet-503", "fleet", 0.15, 503, 250),
		httpErr("dispatch-429", "dispatch", 0.1, 429, 1000),
		truncate("load-trunc", "truck.load", 0.15, 0.2),
		latency("lat", "*", 0.3, 40, 20),
	)}
}

func dispatchIdle(step int) env.Action {
	role := [...]string{"dispatcher", "driver"}[step%2]
	return env.Action{Tool: role + ":wait", Args: json.RawMessage(`{"ms":100}`)}
}

// TestDispatchConformance runs the suite every env passes, each agent idling in its own
// turn, the oracles of both roles under faults.
func TestDispatchConformance(t *testing.T) {
	envtest.Run(t, envtest.Subject{
		Env:    dispatch(t),
		Config: dispatchStress,
		Limits: func(maxInvalid int, deadlineMs int64) json.RawMessage {
			return fmt.Appendf(nil, `{"max_invalid":%d,"deadline_ms":%d}`, maxInvalid, deadlineMs)
		},
		Idle:        dispatchIdle(0),
		IdleAt:      dispatchIdle,
		ErrNotReset: ErrNotReset,
	})
}

// TestDispatchOracleSucceeds: the two roles' oracles deliver the urgent order in every
// world without faults, and in nearly every one when the radio loses, delays and cuts
// their messages and the other services fail.
func TestDispatchOracleSucceeds(t *testing.T) {
	e := dispatch(t)
	for seed := uint64(1); seed <= 200; seed++ {
		r, _, log := play(t, e, env.Config{Seed: seed})
		if r.Reason != gauntletv1.TerminationReason_TERMINATION_REASON_SUCCESS {
			t.Fatalf("seed %d: ended %s\n%s", seed, r.Reason, strings.Join(log, "\n"))
		}
	}
	ok, lost := 0, 0
	for seed := uint64(1); seed <= 200; seed++ {
		r, _, log := play(t, e, dispatchStress(t, seed))
		switch r.Reason {
		case gauntletv1.TerminationReason_TERMINATION_REASON_SUCCESS:
			ok++
		case gauntletv1.TerminationReason_TERMINATION_REASON_FAILURE:
			t.Fatalf("seed %d: the oracles failed under faults\n%s", seed, strings.Join(log, "\n"))
		}
		if strings.Contains(strings.Join(log, "\n"), `"lost":true`) {
			lost++
		}
	}
	if ok < 190 {
		t.Errorf("the oracles succeeded in %d of 200 stressed episodes, want at least 190", ok)
	}
	if lost < 20 {
		t.Errorf("the radio lost a message in %d of 200 stressed episodes; the test means it to lose many", lost)
	}
}

// TestDispatchTurns: the agents act in turn, each action naming its role; each
// observation is addressed to the agent acting next and holds only what that agent may
// see (its own answer, its inbox, its view); the other role's turn, an unknown role and
// another role's tool are invalid actions of the agent whose turn it was.
func TestDispatchTurns(t *testing.T) {
	e := dispatch(t)
	ep, err := e.NewEpisode(env.Config{Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	first, err := ep.Reset()
	if err != nil {
		t.Fatal(err)
	}
	var start map[string]any
	if err := json.Unmarshal(first, &start); err != nil {
		t.Fatal(err)
	}
	if start["world"] != "dispatch" || start["agent"] != "dispatcher" || start["turns"] != "aec" ||
		fmt.Sprint(start["roles"]) != "[dispatcher driver]" || !strings.Contains(fmt.Sprint(start["tools"]), "driver:truck.load") {
		t.Fatalf("first observation: %s", first)
	}
	step := func(tool, args string) (env.StepResult, map[string]any) {
		t.Helper()
		r, err := ep.Step(env.Action{Tool: tool, Args: json.RawMessage(args)})
		if err != nil {
			t.Fatal(err)
		}
		var o map[string]any
		if err := json.Unmarshal(r.Observation, &o); err != nil {
			t.Fatal(err)
		}
		return r, o
	}
	r, o := step("dispatcher:orders.list", `{}`)
	if o["agent"] != "driver" || o["answer"] != nil || strings.Contains(string(r.Observation), "urgent") || r.Signals.GetInvalidAction() {
		t.Fatalf("the driver's first turn shows the dispatcher's answer or is not the driver's: %s", r.Observation)
	}
	r, o = step("dispatcher:wait", `{"ms":10}`) // the driver's turn
	if !r.Signals.GetInvalidAction() || o["agent"] != "dispatcher" {
		t.Fatalf("a dispatcher action in the driver's turn: invalid %v, %s", r.Signals.GetInvalidAction(), r.Observation)
	}
	if a, _ := o["answer"].(map[string]any); a == nil || a["orders"] == nil {
		t.Fatalf("the dispatcher's turn lacks the answer to its orders.list: %s", r.Observation)
	}
	r, _ = step("dispatcher:truck.load", `{"order":"o-1"}`)
	if !r.Signals.GetInvalidAction() || strings.Contains(string(r.Observation), "truck.load") {
		t.Fatalf("another role's tool: invalid %v; its answer is the dispatcher's, not the driver's: %s", r.Signals.GetInvalidAction(), r.Observation)
	}
	r, _ = step("dispatcher:orders.list", `{}`) // the driver's turn: invalid again
	if !r.Signals.GetInvalidAction() || !strings.Contains(string(r.Observation), `role dispatcher has no tool \"truck.load\"`) {
		t.Fatalf("the dispatcher's turn lacks the answer to its call of another role's tool: %s", r.Observation)
	}
	// A message reaches the driver in its inbox, and only there.
	r, o = step("dispatcher:radio.send", `{"to":"driver","text":"o-2@north"}`)
	if o["agent"] != "driver" || !strings.Contains(string(r.Observation), `"inbox":[{"from":"dispatcher","id":"m-1"`) ||
		!strings.Contains(string(r.Diff), `"op":"add","path":"message/m-1"`) {
		t.Fatalf("the driver's inbox after a message: %s %s", r.Observation, r.Diff)
	}
}

// TestDispatchMessageFaults: a message the radio loses stays in the state, marked lost,
// and never reaches its receiver; a delayed one arrives only when its time has come; both
// are the same bytes on a replay of the same seed and actions.
func TestDispatchMessageFaults(t *testing.T) {
	e := dispatch(t)
	run := func(rule *gauntletv1.FaultRule) []string {
		ep, err := e.NewEpisode(env.Config{Seed: 5, Faults: injector(t, 9, rule)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ep.Reset(); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, a := range []env.Action{
			{Tool: "dispatcher:radio.send", Args: json.RawMessage(`{"to":"driver","text":"o-1@east"}`)},
			{Tool: "driver:wait", Args: json.RawMessage(`{"ms":1}`)},
			{Tool: "dispatcher:wait", Args: json.RawMessage(`{"ms":1000}`)},
		} {
			r, err := ep.Step(a)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, string(r.Observation)+" "+string(r.Diff))
		}
		return out
	}
	lost := run(httpErr("lose", "radio", 1, 503, 0))
	if !strings.Contains(lost[0], `"lost":true`) || !strings.Contains(lost[0], `"inbox":[]`) || !strings.Contains(lost[2], `"inbox":[]`) {
		t.Errorf("a lost message:\n%s", strings.Join(lost, "\n"))
	}
	slow := run(latency("slow", "radio", 1, 500, 0))
	if !strings.Contains(slow[0], `"inbox":[]`) || !strings.Contains(slow[2], `"inbox":[{"from":"dispatcher"`) {
		t.Errorf("a delayed message arrives late:\n%s", strings.Join(slow, "\n"))
	}
	if again := run(latency("slow", "radio", 1, 500, 0)); strings.Join(again, "\n") != strings.Join(slow, "\n") {
		t.Errorf("the same seed and actions gave another episode:\n%s\n---\n%s", strings.Join(again, "\n"), strings.Join(slow, "\n"))
	}
}

// TestDispatchRewardsPerRole: each step's signals are those of the agent that acted: a
// milestone the driver reaches is in the driver's progress at once, and in the
// dispatcher's at its next step, whatever that step does.
func TestDispatchRewardsPerRole(t *testing.T) {
	_, _, log := play(t, dispatch(t), env.Config{Seed: 1})
	if len(log) < 4 {
		t.Fatalf("a short episode: %s", strings.Join(log, "\n"))
	}
	e := dispatch(t)
	ep, err := e.NewEpisode(env.Config{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	obs, err := ep.Reset()
	if err != nil {
		t.Fatal(err)
	}
	agent := e.(env.Oracle).Oracle(1)
	sum := map[string]float64{}
	caughtUp := false
	for i := uint32(0); ; i++ {
		a, err := agent.Act(env.Turn{Step: i, Observation: obs})
		if err != nil {
			t.Fatal(err)
		}
		r, err := ep.Step(a)
		if err != nil {
			t.Fatal(err)
		}
		role, _, _ := strings.Cut(a.Tool, ":")
		sum[role] += r.Signals.GetProgressDelta()
		if a.Tool == "dispatcher:wait" && r.Signals.GetProgressDelta() > 0 {
			caughtUp = true // a milestone the driver reached, in the dispatcher's reward
		}
		obs = r.Observation
		if r.Done() {
			break
		}
	}
	// Each role is rewarded once for every milestone, in its first step after it holds,
	// whoever reached it; here every milestone held before each role's last step.
	if sum["driver"] != 1 || sum["dispatcher"] != 1 || !caughtUp {
		t.Errorf("progress per role: %v; the dispatcher rewarded for the driver's milestones while it waited: %v", sum, caughtUp)
	}
}

// TestRoleLoadErrors: bad role declarations are load errors naming file, line and field.
func TestRoleLoadErrors(t *testing.T) {
	const base = `name: two
services: [s]
tools:
  - name: a
    service: s
    description: a
  - name: say
    service: s
    description: say
    args:
      type: object
      properties:
        to: {type: string}
        text: {type: string}
      required: [to, text]
success: "true"
`
	for _, c := range []struct{ extra, want string }{
		{"roles:\n  x:\n    tools: [a, say]\n", "two.yaml:18:3: roles: at least two roles"},
		{"roles:\n  x:\n    tools: [a, nope]\n  y:\n    tools: [say]\n", "two.yaml:19:16: roles.x.tools[1]: unknown tool \"nope\""},
		{"roles:\n  x:\n    tools: [a]\n  y:\n    tools: [a]\n", "two.yaml:7:5: tools[1]: tool \"say\" belongs to no role"},
		{"roles:\n  x:\n    tools: [a]\n  9y:\n    tools: [say]\n", "two.yaml:20:3: roles.9y: bad role name"},
		{"turns: sometimes\nroles:\n  x:\n    tools: [a]\n  y:\n    tools: [say]\n", "two.yaml:17:8: turns: want aec or simultaneous"},
		{"turns: aec\n", "two.yaml:17:8: turns: only a world with roles has turns"},
		{"messages: {tool: a}\nroles:\n  x:\n    tools: [a]\n  y:\n    tools: [say]\n", "two.yaml:17:18: messages.tool: tool a needs a required string argument to"},
		{"roles:\n  x:\n    tools: [a]\n    oracle:\n      - when: turn.view.n > 0\n        call: a\n  y:\n    tools: [say]\n", "two.yaml:21:7: roles.x.oracle: the last rule has no when"},
		{"roles:\n  x:\n    tools: [a]\n    oracle:\n      - call: say\n        args: {to: \"'y'\", text: \"'hi'\"}\n  y:\n    tools: [say]\n    oracle:\n      - call: say\n        args: {to: \"'x'\", text: \"'hi'\"}\n", "two.yaml:21:15: roles.x.oracle[0].call: tool say is not one of role x's tools"},
		{"roles:\n  x:\n    tools: [a]\n    view: {n: nope}\n  y:\n    tools: [say]\n", "two.yaml:20:15: roles.x.view.n: "},
		{"roles:\n  x:\n    tools: [a]\n    colour: red\n  y:\n    tools: [say]\n", "two.yaml:20:5: roles.x.colour: unknown key"},
		{"observation: {inbox: \"1\"}\nroles:\n  x:\n    tools: [a]\n  y:\n    tools: [say]\n", "two.yaml:17:22: observation.inbox: key \"inbox\" is gauntlet's own in a world with roles"},
	} {
		_, err := Load("two.yaml", []byte(base+c.extra))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q:\n got %v\nwant %s", c.extra, err, c.want)
		}
	}
}

// TestSimultaneousTurns: moving simultaneously, every agent chooses from its view at the
// round's start, so the second sees nothing of the first's move in the same round; in
// turn (aec), it sees the state the first left.
func TestSimultaneousTurns(t *testing.T) {
	const file = `name: duel
services: [s]
turns: TURNS
vars:
  a: {type: int, value: 0}
  b: {type: int, value: 0}
roles:
  left: {tools: [l.inc], view: {a: a, b: b}}
  right: {tools: [r.inc], view: {a: a, b: b}}
tools:
  - name: l.inc
    service: s
    description: add one to a
    effects: [{set: a, to: a + 1}]
  - name: r.inc
    service: s
    description: add one to b
    effects: [{set: b, to: b + 1}]
success: a + b >= 10
`
	for _, c := range []struct{ turns, second, third string }{
		{"simultaneous", `"view":{"a":0,"b":0}`, `"view":{"a":1,"b":1}`},
		{"aec", `"view":{"a":1,"b":0}`, `"view":{"a":1,"b":1}`},
	} {
		w, err := Load("duel.yaml", []byte(strings.Replace(file, "TURNS", c.turns, 1)))
		if err != nil {
			t.Fatal(err)
		}
		ep, err := w.Env().NewEpisode(env.Config{Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		first, err := ep.Reset()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(first), `"turns":"`+c.turns+`","agent":"left"`) {
			t.Errorf("%s: first observation %s", c.turns, first)
		}
		r1, err := ep.Step(env.Action{Tool: "left:l.inc", Args: json.RawMessage(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		r2, err := ep.Step(env.Action{Tool: "right:r.inc", Args: json.RawMessage(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(r1.Observation), `"agent":"right"`) || !strings.Contains(string(r1.Observation), c.second) {
			t.Errorf("%s: the second agent's turn: %s, want %s", c.turns, r1.Observation, c.second)
		}
		if !strings.Contains(string(r2.Observation), `"agent":"left","answer":{"ok":true}`) || !strings.Contains(string(r2.Observation), c.third) {
			t.Errorf("%s: the next round's first turn: %s, want %s", c.turns, r2.Observation, c.third)
		}
	}
}
