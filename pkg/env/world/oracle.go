package world

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/bits"
	"slices"
	"strconv"

	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/interpreter"

	"github.com/gauntlet-rl/gauntlet/pkg/canonjson"
	"github.com/gauntlet-rl/gauntlet/pkg/env"
)

// oracle follows a world's plan. It knows only what the observations tell it: the first
// observation (task) and the answers of the steps done (results). It honours
// retry_after_ms by waiting with the plan's wait tool before retrying, retries a call an
// injected error failed, re-issues a read whose answer was truncated, and after a
// truncated write asks the step's recover call what happened (or, without one, retries
// and takes a violation of one of the step's done_if_rule rules as the sign that the
// first attempt went through).
type oracle struct {
	w       *World
	p       *oraclePlan
	started bool
	// task is the first observation and results the answers by step name: records
	// (the results one grows as answers arrive), what the plan's expressions read as
	// task and results; taskVal and resultsVal are the same as CEL values.
	task, results       *record
	taskVal, resultsVal ref.Val
	// act is the activation of the plan's compiled expressions (closures); locals
	// holds their comprehensions' slots.
	act    activation
	locals episode
	// memo holds the values of the plan's remembered expressions (planMemo), each
	// computed since the last answer it reads (World.planReads) was added.
	memo       []ref.Val
	pc         int
	last       env.Action
	pending    *env.Action
	recovering bool
	// largest is the bit length of the largest value the plan's expressions may read
	// (the task's and the results', the results themselves): what decides whether an
	// expression runs without cost tracking (boundPlan).
	largest int
	// scratch is the room decodeAnswerWith reads an answer's values in.
	scratch []ref.Val
	// built is the call whose action builtAct holds, until the results change.
	built    *oracleCall
	builtAct env.Action
}

// planVars is the activation of the plan's expressions.
type planVars struct{ o *oracle }

func (a planVars) ResolveName(name string) (any, bool) {
	switch name {
	case "task":
		return a.o.taskVal, true
	case "results":
		return a.o.resultsVal, true
	}
	return nil, false
}

// activation is the activation of the plan's compiled expressions.
func (o *oracle) activation() *activation {
	if o.act.plan == nil {
		o.locals = episode{w: o.w, loc: make([]ref.Val, o.w.locals)}
		o.act = activation{ep: &o.locals, plan: o}
	}
	return &o.act
}

func (a planVars) Parent() interpreter.Activation { return nil }

// Act chooses the next action from the previous one and its observation. It fails only
// on a first observation that is not this world's and on a plan expression that fails
// (a defect of the world file); a step the world keeps refusing is tried again until
// the episode's limits end it.
func (o *oracle) Act(t env.Turn) (env.Action, error) {
	if !o.started {
		task, size, ok := decodeAnswerWith(t.Observation, o.p.adapter, &o.scratch)
		// A world that does not identify itself (identify: false) has no name to check.
		if !ok || o.w.identify && task.field("world") != types.String(o.w.name) {
			return env.Action{}, fmt.Errorf("world %s oracle: first observation is not this world's: %.80s", o.w.name, t.Observation)
		}
		n := len(o.p.steps) // an answer a step, at most
		o.results = &record{keys: &recordKeys{names: make([]string, 0, n), adapter: o.p.adapter}, vals: make([]ref.Val, 0, n)}
		o.task, o.started = task, true
		o.taskVal, o.resultsVal = o.task, o.results
		o.largest = bits.Len64(max(size, 1)) // a number's size is 1
		return o.next()
	}
	v, size, ok := decodeAnswerWith(t.Observation, o.p.adapter, &o.scratch)
	if !ok {
		return o.last, nil // garbled: ask again
	}
	if o.pending != nil && o.last.Tool == o.p.waitTool.name {
		a := *o.pending
		o.pending = nil
		return o.do(a), nil
	}
	if o.pc >= len(o.p.steps) {
		return o.last, nil // the plan is done; the world has not ended: its limits will
	}
	cur := &o.p.steps[o.pc]
	mine := o.last.Tool == cur.call.tool.name || o.recovering && o.last.Tool == cur.recover.tool.name
	if !mine {
		// An action the plan did not choose (played before an episode fork): go on
		// from the current step.
		o.recovering = false
		return o.retry(cur)
	}
	switch {
	case v.field("truncated") == types.True:
		if o.recovering || len(o.w.tool(o.last.Tool).effects) == 0 || cur.recover == nil {
			return o.last, nil
		}
		o.recovering = true
		a, err := o.action(cur.recover)
		if err != nil {
			return env.Action{}, err
		}
		return o.do(a), nil
	case v.field("ok") == types.True:
		o.results.put(cur.name, v)
		o.built = nil
		// What read this answer (or might have) is computed again; the rest stays.
		for slot, v := range o.memo {
			if v != nil && o.w.planReads[slot].reads(cur.name) {
				o.memo[slot] = nil
			}
		}
		o.largest = max(o.largest, bits.Len64(size), bits.Len(uint(len(o.results.vals))))
		o.recovering = false
		o.pc++
		return o.next()
	}
	if ms, ok := v.field("retry_after_ms").(types.Int); ok && ms > 0 {
		last := o.last
		o.pending = &last
		b := canonjson.AppendString([]byte("{"), o.p.waitArg)
		b = append(b, ':')
		b = strconv.AppendInt(b, int64(ms), 10)
		return o.do(env.Action{Tool: o.p.waitTool.name, Args: append(b, '}')}), nil
	}
	if v.field("status") != nil {
		return o.last, nil // an injected error: the call did nothing; again
	}
	if rule, _ := v.field("rule").(types.String); rule != "" && slices.Contains(cur.doneIfRules, string(rule)) {
		o.pc++
		return o.next()
	}
	// The write did not happen after all, or the world refused the step: do it again.
	o.recovering = false
	return o.retry(cur)
}

// Follow takes over an episode someone else began (env.Follower): it reads each
// observation as its own Act would, and the action played becomes its last.
func (o *oracle) Follow(t env.Turn, played env.Action) {
	_, _ = o.Act(t) // an error (a first observation not of this world) leaves it unstarted
	if played.Tool != o.p.waitTool.name {
		o.pending = nil
	}
	o.last = played
}

func (o *oracle) retry(cur *oracleStep) (env.Action, error) {
	a, err := o.action(&cur.call)
	if err != nil {
		return env.Action{}, err
	}
	return o.do(a), nil
}

// next starts the next step whose condition holds.
func (o *oracle) next() (env.Action, error) {
	for o.pc < len(o.p.steps) {
		s := &o.p.steps[o.pc]
		if s.when != nil {
			ok, err := evalBool(s.when, planVars{o})
			if err != nil {
				return env.Action{}, fmt.Errorf("world %s oracle: %w", o.w.name, err)
			}
			if !ok {
				o.pc++
				continue
			}
		}
		a, err := o.action(&s.call)
		if err != nil {
			return env.Action{}, err
		}
		return o.do(a), nil
	}
	return o.last, nil // the plan is done; the world has not ended: its limits will
}

func (o *oracle) do(a env.Action) env.Action {
	o.last = a
	return a
}

// action builds a call's arguments (keys sorted, canonical JSON). They depend only on
// the task and the results, so a call retried before the results change is the one
// built before.
func (o *oracle) action(c *oracleCall) (env.Action, error) {
	if c == o.built {
		return o.builtAct, nil
	}
	a, err := callAction(o.w, c, planVars{o})
	if err != nil {
		return env.Action{}, err
	}
	a.Args = a.Args[:len(a.Args):len(a.Args)] // shared by the retries: an append copies
	o.built, o.builtAct = c, a
	return a, nil
}

// callAction builds a call of a plan or a rule, its arguments evaluated over act.
func callAction(w *World, c *oracleCall, act interpreter.Activation) (env.Action, error) {
	b := append(make([]byte, 0, 64), '{') // the shop's calls fit: one allocation, not three
	for i, f := range c.args {
		v, err := eval(f.val, act)
		if err != nil {
			return env.Action{}, fmt.Errorf("world %s oracle: %w", w.name, err)
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = canonjson.AppendString(b, f.key)
		b = append(b, ':')
		if d, ok := v.(types.Double); ok && float64(d) == float64(int64(d)) {
			v = types.Int(int64(d))
		}
		if b, err = appendVal(b, v); err != nil {
			return env.Action{}, fmt.Errorf("world %s oracle: %s: %w", w.name, f.key, err)
		}
	}
	return env.Action{Tool: c.tool.name, Args: append(b, '}')}, nil
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// decodeObs decodes an observation object, integers as int64 and other numbers as
// float64, the types the plan's expressions compare.
func decodeObs(raw []byte) (map[string]any, bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil || m == nil {
		return nil, false
	}
	return fixNumbers(m).(map[string]any), true
}

func fixNumbers(v any) any {
	switch x := v.(type) {
	case json.Number:
		if n, err := strconv.ParseInt(string(x), 10, 64); err == nil {
			return n
		}
		f, _ := x.Float64()
		return f
	case map[string]any:
		for k, e := range x {
			x[k] = fixNumbers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = fixNumbers(e)
		}
	}
	return v
}
