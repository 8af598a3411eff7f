package world

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/interpreter"

	"github.com/gauntlet-rl/gauntlet/pkg/canonjson"
	"github.com/gauntlet-rl/gauntlet/pkg/env"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// multi is the turn-taking state of an episode of a world with roles.
type multi struct {
	// progress is each role's progress: the milestone it was last rewarded for, so a
	// milestone another agent reached is in the role's next step's reward.
	progress []int
	// answers holds each role's last answer (nil before it acted): it reaches the
	// role in the observation of its next turn, and only there.
	answers [][]byte
	// views are the observations of the round's turns, taken at its start, when the
	// roles move simultaneously.
	views [][]byte
}

// actor is the index of the role whose turn it is.
func (e *episode) actor() int { return int(e.step) % len(e.w.roles) }

// resetRoles ends the first observation of a world with roles: the roles, the turn
// order and the first role's turn.
func (e *episode) resetRoles(b []byte) ([]byte, error) {
	w := e.w
	n := len(w.roles)
	e.ma = &multi{progress: make([]int, n), answers: make([][]byte, n)}
	b = append(b, `,"roles":[`...)
	for i, r := range w.roles {
		if i > 0 {
			b = append(b, ',')
		}
		b = canonjson.AppendString(b, r.name)
	}
	b = append(b, `],"turns":`...)
	b = canonjson.AppendString(b, w.turns.String())
	first, err := e.nextTurn()
	if err != nil {
		return nil, err
	}
	b = append(b, ',')
	return append(b, first[1:len(first)-1]...), nil
}

// nextTurn is the observation addressed to the role whose turn it is: its own view of the
// state now (or, moving simultaneously, at the round's start).
func (e *episode) nextTurn() ([]byte, error) {
	r := e.actor()
	if e.w.turns != turnsSimultaneous {
		return e.turn(r)
	}
	if r == 0 {
		e.ma.views = e.ma.views[:0]
		for k := range e.w.roles {
			v, err := e.turn(k)
			if err != nil {
				return nil, err
			}
			e.ma.views = append(e.ma.views, v)
		}
	}
	return e.ma.views[r], nil
}

// turn is role r's observation now: {"agent", "answer" (to its last action), "inbox"
// (the messages delivered to it so far), "view" (its view's keys)}.
func (e *episode) turn(r int) ([]byte, error) {
	w := e.w
	role := &w.roles[r]
	b := []byte(`{"agent":`)
	b = canonjson.AppendString(b, role.name)
	if a := e.ma.answers[r]; a != nil {
		b = append(b, `,"answer":`...)
		b = append(b, a...)
	}
	b = append(b, `,"inbox":[`...)
	if w.msgEntity >= 0 {
		now := e.clock.Milliseconds()
		st := &e.ents[w.msgEntity]
		n := 0
		for _, id := range st.ids {
			o, _ := st.row(id)
			m := o.vals // id, from, to, text, sent_ms, deliver_ms, lost
			if string(m[2].(types.String)) != role.name || bool(m[6].(types.Bool)) || int64(m[5].(types.Int)) > now {
				continue
			}
			if n > 0 {
				b = append(b, ',')
			}
			n++
			b = append(b, `{"from":`...)
			b = appendScalar(b, m[1])
			b = append(b, `,"id":`...)
			b = appendScalar(b, m[0])
			b = append(b, `,"sent_ms":`...)
			b = appendScalar(b, m[4])
			b = append(b, `,"text":`...)
			b = appendScalar(b, m[3])
			b = append(b, '}')
		}
	}
	b = append(b, `],"view":{`...)
	b, err := e.appendFields(b, role.view, e.scope(nil))
	if err != nil {
		return nil, err
	}
	return append(b, "}}"...), nil
}

// stepRole plays the action of the role whose turn it is. The action names the role
// ("role:tool"); one naming another role, or a tool the role does not have, is an
// invalid action of the role whose turn it was. The step's signals are the role's: its
// progress, spend, violations. The step's observation is the next role's turn; the
// acting role reads its answer in its own next turn.
func (e *episode) stepRole(act env.Action) (env.StepResult, error) {
	w := e.w
	r := e.actor()
	role := &w.roles[r]
	var t *toolDef
	var bad []byte
	name, tool, ok := strings.Cut(act.Tool, ":")
	if !ok {
		bad = failObs(0, fmt.Sprintf("action %q names no role", clip(act.Tool)), 0, "", "",
			"name the role that acts: "+role.name+":TOOL")
	} else if name != role.name {
		bad = failObs(0, fmt.Sprintf("it is %s's turn, not %q's", role.name, clip(name)), 0, "", "",
			"name the role that acts: "+role.name+":TOOL")
	} else if i := slices.IndexFunc(role.tools, func(t *toolDef) bool { return t.name == tool }); i < 0 {
		names := make([]string, len(role.tools))
		for k, t := range role.tools {
			names[k] = role.name + ":" + t.name
		}
		bad = failObs(0, fmt.Sprintf("role %s has no tool %q", role.name, clip(tool)), 0, "", "", "use one of: "+strings.Join(names, ", "))
	} else {
		t = role.tools[i]
	}
	res, err := e.apply(act, t, bad)
	if err != nil {
		return res, err
	}
	// e.progress is the world's; the role's delta runs from what it was last given.
	total := float64(max(len(w.progress), 1))
	res.Signals.ProgressDelta = float64(e.progress-e.ma.progress[r]) / total
	e.ma.progress[r] = e.progress
	e.ma.answers[r] = res.Observation
	obs, err := e.nextTurn()
	if err != nil {
		e.done = true
		return env.StepResult{}, fmt.Errorf("world %s: %w", w.name, err)
	}
	res.Observation = obs
	return res, nil
}

// send is a call of the message tool: the message joins the state (the message
// entity), whatever befalls it. Its service's faults act on the message, not on the
// sender, who is told it was sent: an injected error loses it (lost), latency delays
// its delivery, a truncation cuts its text. Sending to no role, or to oneself, is
// refused.
func (e *episode) send(t *toolDef, args *object, s *stepState) ([]byte, []*gauntletv1.FaultFired, error) {
	w := e.w
	from := w.roles[e.actor()].name
	to := args.vals[t.msgTo].(types.String)
	if string(to) == from || !slices.ContainsFunc(w.roles, func(r roleDef) bool { return r.name == string(to) }) {
		s.errors++
		others := make([]string, 0, len(w.roles)-1)
		for _, r := range w.roles {
			if r.name != from {
				others = append(others, r.name)
			}
		}
		return failObs(0, fmt.Sprintf("no role %q to send to", clip(string(to))), 0, "", "", "send to one of: "+strings.Join(others, ", ")), nil, nil
	}
	svc := t.svc
	sent := e.clock
	base := time.Duration(e.baseMs[svc]+e.lat.Int64N(e.baseMs[svc]/4+1)) * time.Millisecond
	out := e.cfg.Faults.Call(w.services[svc], t.name, sent)
	e.clock += base
	text := args.vals[t.msgText]
	if out.Keep < 1 {
		text = types.String(out.Truncate([]byte(text.(types.String))))
	}
	lost := out.Status != 0
	if lost {
		s.errors++
	}
	row := newObject(w.entities[w.msgEntity].otype)
	row.vals[1], row.vals[2], row.vals[3] = types.String(from), to, text
	row.vals[4] = types.Int(sent.Milliseconds())
	row.vals[5] = types.Int((sent + base + out.Latency).Milliseconds())
	row.vals[6] = types.Bool(lost)
	s.ran = true
	id := e.add(w.msgEntity, row, s)
	b := []byte(`{"ok":true,"message_id":`)
	b = appendScalar(b, id)
	return append(b, '}'), out.Fired, nil
}

// roleOracle plays every role of a world by its rules: at each turn, the first rule of
// the acting role whose when holds for the observation addressed to it gives the call.
// It reads nothing but that observation, so a role's oracle knows only what the role's
// agent would.
type roleOracle struct {
	w    *World
	turn map[string]any
}

func (o *roleOracle) ResolveName(name string) (any, bool) {
	if name == "turn" {
		return o.turn, true
	}
	return nil, false
}

func (o *roleOracle) Parent() interpreter.Activation { return nil }

// Act chooses the acting role's call. It fails only on an observation that names no
// role of the world and on a rule expression that fails (a defect of the world file):
// the loader makes every role's last rule one without when.
func (o *roleOracle) Act(t env.Turn) (env.Action, error) {
	v, ok := decodeObs(t.Observation)
	if !ok {
		return env.Action{}, fmt.Errorf("world %s oracle: observation is not an object: %.80s", o.w.name, t.Observation)
	}
	name, _ := v["agent"].(string)
	k := slices.IndexFunc(o.w.roles, func(r roleDef) bool { return r.name == name })
	if k < 0 {
		return env.Action{}, fmt.Errorf("world %s oracle: observation names no role of the world: %.80s", o.w.name, t.Observation)
	}
	role := &o.w.roles[k]
	o.turn = v
	for i := range role.oracle {
		rule := &role.oracle[i]
		if rule.when != nil {
			ok, err := evalBool(rule.when, o)
			if err != nil {
				return env.Action{}, fmt.Errorf("world %s oracle: %w", o.w.name, err)
			}
			if !ok {
				continue
			}
		}
		a, err := callAction(o.w, &rule.call, o)
		if err != nil {
			return env.Action{}, err
		}
		a.Tool = role.name + ":" + a.Tool
		return a, nil
	}
	return env.Action{}, fmt.Errorf("world %s oracle: no rule of role %s holds", o.w.name, role.name)
}
