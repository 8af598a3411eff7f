package world

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"
	"cel.dev/cel-go/interpreter"

	"github.com/gauntlet-rl/gauntlet/pkg/canonjson"
	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// RuleRespectRetryAfter is the causal rule every world shares with the shop: a service
// that answered with Retry-After keeps failing until that time has passed on the virtual
// clock.
const RuleRespectRetryAfter = "respect_retry_after"

// ErrNotReset is returned by Step before the first Reset.
var ErrNotReset = errors.New("world: Step before Reset")

// ErrEpisodeOver is returned by Step after the episode terminated or was truncated.
var ErrEpisodeOver = errors.New("world: episode is over")

// evalError is an expression that failed on real values: a defect of the world file,
// reported as an infra error naming the place.
type evalError struct {
	at  place
	err error
}

func (e *evalError) Error() string {
	return fmt.Sprintf("line %d: %s: %v", e.at.line, e.at.field, e.err)
}

func (e *evalError) Unwrap() error { return e.err }

type episode struct {
	w          *World
	cfg        env.Config
	maxSteps   uint32
	deadlineMs int64
	maxInvalid int64
	// params are the values of the world's params (World.params), from the request;
	// nil for the defaults.
	params []ref.Val
	// fast: the episode stays within the world's max_steps, so the programs whose cost
	// the world bounded at load run without cost tracking (program.fast).
	fast bool

	ready  bool
	done   bool
	reason gauntletv1.TerminationReason
	// vars holds the variables by position, ents the entity collections: as CEL values,
	// so that expressions read them without converting anything.
	vars []ref.Val
	ents []collection
	// perms holds the elements of the first lists(int) drawn by shuffle, which a
	// compiled index reads (closures.indexed); permVar[j] is the variable of perms[j]
	// plus one (0: none). perm is the last shuffle drawValue made.
	perms   [maxPerms][]ref.Val
	permVar [maxPerms]int
	perm    []ref.Val
	// act is the activation of the episode's expressions, reused by every evaluation;
	// loc holds the comprehension variables of compiled expressions (program.run).
	act activation
	loc []ref.Val
	// changes is run's scratch. caps holds, per tool, the largest answer (at
	// 2*index) and diff (2*index+1) its calls made so far: the capacity the next
	// starts with, so a small answer does not start at the size of a search's.
	changes []change
	caps    []int
	// argObjs holds each tool's arguments object, reused by its next call.
	argObjs []*object
	// lastList and lastElems are listElems' memory.
	lastList  traits.Lister
	lastElems []ref.Val
	// settled holds the values of the comprehensions and calls over the state that a
	// step's reach and answer compute, by their slot in World.settledSlots: cleared
	// once the step's effects are applied.
	settled []ref.Val
	// settledEpoch numbers the steps' settled states (from 1; 0 before the first);
	// sizedKeys holds, by sizedBound.sig, the sizes of the paths measured in epoch
	// sizedAt (sizedBound.underSettled).
	settledEpoch uint64
	sizedAt      [maxSizedSigs]uint64
	sizedKeys    [maxSizedSigs][maxSizedPaths]byte
	// strs is the block the episode's concatenations are written into (joinStrings):
	// kept across resets, its written bytes never written again.
	strs []byte
	// box holds the blocks of the ints and strings a reset draws (boxes.go): kept
	// across resets like strs.
	box      boxes
	clock    time.Duration
	step     uint32
	invalid  int64
	progress int
	budget   int64
	// known[k] says verdict[k] is end condition k's value on the current state (see
	// World.ends): evaluated since the last step that wrote what it reads.
	known   []bool
	verdict []bool
	// partKnown[j] says partValue[j] is the value of the end conditions' part j
	// (endparts.go) on the current state.
	partKnown []bool
	partValue []types.Bool

	downUntil  []time.Duration
	downStatus []uint32
	baseMs     []int64
	lat        *rand.Rand

	// ma is the turn-taking of a world with roles (nil for one agent).
	ma *multi
}

// activation resolves the names expressions read: the state (by the position the world
// gave each name when it loaded), the clock, the step, and what the evaluation adds
// (args, new_id, an entity's i, id and self while it is drawn).
type activation struct {
	ep    *episode
	args  *object
	newID ref.Val
	i     ref.Val
	id    ref.Val
	self  *object
	// ends: the end conditions are being evaluated (their parts may be remembered).
	ends bool
	// elemName and elem: the element an answer's list of objects is being written for.
	elemName string
	elem     ref.Val
	// plan: the oracle whose plan expression is being evaluated (its ep holds nothing
	// but the comprehensions' slots); the expression reads its task and results only.
	plan *oracle
	// settled: a tool's effects are applied and the state stays as it is until the
	// step ends, so what its reach and answer compute over it is remembered
	// (episode.settled).
	settled bool
}

func (a *activation) ResolveName(name string) (any, bool) {
	if a.plan != nil {
		return planVars{a.plan}.ResolveName(name)
	}
	if k, ok := a.ep.w.slots[name]; ok {
		if k >= 0 {
			v := a.ep.vars[k]
			return v, v != nil // a variable is read before it is drawn
		}
		if k = -k - 1; k < len(a.ep.ents) {
			return &a.ep.ents[k], true
		}
		return nil, false
	}
	switch name {
	case "args":
		return a.args, a.args != nil
	case "now_ms":
		return types.Int(a.ep.clock.Milliseconds()), true
	case "step":
		return types.Int(a.ep.step), true
	case "new_id":
		return a.newID, a.newID != nil
	case "i":
		return a.i, a.self != nil
	case "id":
		return a.id, a.self != nil
	case "self":
		return a.self, a.self != nil
	}
	if a.elem != nil && name == a.elemName {
		return a.elem, true
	}
	return nil, false
}

func (a *activation) Parent() interpreter.Activation { return nil }

// scope points the reused activation at a tool call's arguments (nil for none) and
// forgets what an earlier evaluation added.
func (e *episode) scope(args *object) *activation {
	e.act = activation{ep: e, args: args}
	return &e.act
}

func eval(p *program, act interpreter.Activation) (ref.Val, error) {
	prg := p.prg
	switch a := act.(type) {
	case planVars:
		if p.fast != nil && a.o.largest <= p.planFit {
			prg = p.fast
			if checkPlanCost != nil {
				checkPlanCost(p, a)
			}
			if p.run != nil {
				act := a.o.activation()
				if v := p.run(act); !types.IsError(v) {
					if checkClosures != nil {
						checkClosures(p, act, v)
					}
					return v, nil
				}
			}
		}
	case *activation:
		if p.fast != nil && a.ep.fast {
			prg = p.fast
		}
		if p.run != nil && p.closes(a) {
			if v := p.run(a); !types.IsError(v) {
				if checkClosures != nil {
					checkClosures(p, a, v)
				}
				return v, nil
			}
		}
	}
	out, _, err := prg.Eval(act)
	if err != nil {
		return nil, &evalError{at: p.at, err: err}
	}
	return out, nil
}

// closes reports whether the closures may answer p on a's state: without cost
// tracking, because the world bounded p's cost at load and the episode stays within
// max_steps, or because the state's sizes keep it under the limit.
func (p *program) closes(a *activation) bool {
	return p.fast != nil && a.ep.fast || p.sized != nil && p.sized.underSettled(a)
}

func evalInt(p *program, act interpreter.Activation) (int64, error) {
	if p.unboxed.i != nil {
		if a, ok := act.(*activation); ok && p.closes(a) {
			if v, ok := p.unboxed.i(a); ok {
				if checkClosures != nil {
					checkClosures(p, a, v)
				}
				return int64(v), nil
			}
		}
	}
	v, err := eval(p, act)
	if err != nil {
		return 0, err
	}
	n, ok := v.(types.Int)
	if !ok {
		return 0, &evalError{at: p.at, err: fmt.Errorf("got %s, want int", v.Type())}
	}
	return int64(n), nil
}

func evalBool(p *program, act interpreter.Activation) (bool, error) {
	if p.unboxed.b != nil {
		if a, ok := act.(*activation); ok && p.closes(a) {
			if v, ok := p.unboxed.b(a); ok {
				if checkClosures != nil {
					checkClosures(p, a, v)
				}
				return bool(v), nil
			}
		}
	}
	v, err := eval(p, act)
	if err != nil {
		return false, err
	}
	b, ok := v.(types.Bool)
	if !ok {
		return false, &evalError{at: p.at, err: fmt.Errorf("got %s, want bool", v.Type())}
	}
	return bool(b), nil
}

// checkKind checks that a state value computed by an expression has the state's type
// (and a string, its bound).
func checkKind(v ref.Val, k kind, at place) (ref.Val, error) {
	switch x := v.(type) {
	case types.Int:
		if k == kInt {
			return v, nil
		}
	case types.String:
		if k == kString {
			if len(x) > maxStateString {
				return nil, &evalError{at: at, err: fmt.Errorf("a string of %d bytes exceeds the limit of %d for a string of the state", len(x), maxStateString)}
			}
			return v, nil
		}
	case types.Bool:
		if k == kBool {
			return v, nil
		}
	case traits.Lister:
		if k == kInts {
			return v, nil
		}
	}
	return nil, &evalError{at: at, err: fmt.Errorf("got %s, want %s", v.Type(), k)}
}

// celValue is a literal of the world file (int64, string or bool) as a CEL value.
func celValue(v any) ref.Val {
	switch x := v.(type) {
	case int64:
		return types.Int(x)
	case string:
		return types.String(x)
	case bool:
		return types.Bool(x)
	}
	return types.NullValue
}

func (e *episode) Now() time.Duration { return e.clock }

// Reset rebuilds the world from the seed and returns the first observation. The fault
// injector is the caller's and is not rewound.
func (e *episode) Reset() (json.RawMessage, error) {
	obs, err := e.reset(e.cfg.Seed)
	if err != nil {
		return nil, fmt.Errorf("world %s: reset: %w", e.w.name, err)
	}
	return obs, nil
}

func (e *episode) reset(seed uint64) ([]byte, error) {
	w := e.w
	loc := e.loc
	if len(loc) < w.locals {
		loc = make([]ref.Val, w.locals)
	}
	*e = episode{w: w, cfg: e.cfg, maxSteps: e.maxSteps, deadlineMs: e.deadlineMs, maxInvalid: e.maxInvalid, params: e.params, fast: e.fast, ready: true, loc: loc, strs: e.strs, box: e.box,
		settledEpoch: e.settledEpoch, sizedAt: e.sizedAt} // the epochs go on: what sizedAt holds is older
	r := rng.New(seed, w.stateStream, 0)
	e.box.reserve(boxCount{w.resetBoxes[0].Load(), w.resetBoxes[1].Load()})
	made := e.box.made
	e.vars = make([]ref.Val, len(w.vars))
	act := e.scope(nil)
	redraws := 0
	for i := range w.params {
		if e.params != nil {
			e.vars[i] = e.params[i]
		} else {
			e.vars[i] = w.params[i].def
		}
	}
	for i := len(w.params); i < len(w.vars); i++ {
		dr := &w.vars[i].draw
		e.perm = nil
		v, err := drawValue(r, dr, act)
		if err != nil {
			return nil, err
		}
		e.vars[i] = v
		e.setPerm(i, e.perm)
		if again, err := redraw(dr, act, &redraws); err != nil {
			return nil, err
		} else if again {
			i = dr.redrawFrom - 1
		}
	}
	e.ents = make([]collection, 0, len(w.entities))
	for k := range w.entities {
		ed := &w.entities[k]
		n, err := drawValue(r, &ed.count, act)
		if err != nil {
			return nil, err
		}
		count := int64(n.(types.Int))
		if count < 0 || count > 10000 {
			return nil, &evalError{at: place{field: sub(sub("entities", ed.name), "count")}, err: fmt.Errorf("count %d is out of range [0, 10000]", count)}
		}
		e.ents = append(e.ents, collection{ids: make([]string, 0, count), objs: make([]*object, 0, count)})
		if count > smallCollection {
			e.ents[k].rows = make(map[string]*object, count)
		}
		st := &e.ents[k]
		// The entities and their fields in two allocations, not two per entity.
		nf := len(ed.otype.fields)
		rows := make([]object, count)
		vals := make([]ref.Val, int(count)*nf)
		for i := range count {
			row := &rows[i]
			row.t, row.vals = ed.otype, vals[int(i)*nf:int(i+1)*nf:int(i+1)*nf]
			if i < int64(len(ed.startIDs)) {
				row.vals[0] = ed.startIDs[i]
			} else {
				row.vals[0] = types.String(ed.prefix + strconv.FormatInt(i+1, 10))
			}
			id := string(row.vals[0].(types.String))
			act.i, act.id, act.self = types.Int(i), row.vals[0], row
			redraws := 0
			for j := 0; j < len(ed.fields); j++ {
				dr := &ed.fields[j].draw
				v, err := drawValue(r, dr, act)
				if err != nil {
					return nil, err
				}
				row.vals[j+1] = v
				if again, err := redraw(dr, act, &redraws); err != nil {
					return nil, err
				} else if again {
					j = dr.redrawFrom - 1
				}
			}
			if ed.key >= 0 {
				id = string(row.vals[ed.key+1].(types.String))
				if _, dup := st.row(id); dup || id == "" {
					return nil, &evalError{at: ed.keyAt,
						err: fmt.Errorf("key %q is empty or already another %s's id (redraw it while self.%s in %s)", clip(id), ed.name, ed.fields[ed.key].name, ed.name)}
				}
				row.vals[0] = row.vals[ed.key+1]
			}
			st.put(id, row)
		}
		act.i, act.id, act.self = nil, nil, nil
	}
	for i, n := range [2]int64{e.box.made.ints - made.ints, e.box.made.strs - made.strs} {
		if n > w.resetBoxes[i].Load() && n <= maxBoxHint {
			w.resetBoxes[i].Store(n)
		}
	}
	ne := len(w.ends)
	bools := make([]bool, 2*ne+len(w.parts))
	e.known, e.verdict, e.partKnown = bools[:ne:ne], bools[ne:2*ne:2*ne], bools[2*ne:]
	e.partValue = make([]types.Bool, len(w.parts))
	if w.budget != nil {
		b, err := evalInt(w.budget, act)
		if err != nil {
			return nil, err
		}
		e.budget = b
	}
	n := len(w.services)
	e.downUntil, e.downStatus, e.baseMs = make([]time.Duration, n), make([]uint32, n), make([]int64, n)
	e.lat = rng.New(seed, w.latencyStream, 0)
	for i := range e.baseMs {
		e.baseMs[i] = 5 + e.lat.Int64N(36)
	}
	b := append(make([]byte, 0, max(w.resetCap.Load(), 64)), '{')
	if w.identify {
		b = append(b, `"world":`...)
		b = canonjson.AppendString(b, w.name)
		b = append(b, `,"digest":`...)
		b = canonjson.AppendString(b, w.digest)
		if len(w.reset) > 0 {
			b = append(b, ',')
		}
	}
	var err error
	if b, err = e.appendFields(b, w.reset, act); err != nil {
		return nil, err
	}
	if len(b) > 1 {
		b = append(b, ',')
	}
	b = append(b, `"deadline_ms":`...)
	b = strconv.AppendInt(b, e.deadlineMs, 10)
	b = append(b, `,"max_steps":`...)
	b = strconv.AppendUint(b, uint64(e.maxSteps), 10)
	b = append(b, `,"tools":[`...)
	names := w.toolNames
	if len(w.roles) > 0 {
		names = w.qualNames
	}
	for i, t := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = canonjson.AppendString(b, t)
	}
	b = append(b, ']')
	if len(w.roles) > 0 {
		var err error
		if b, err = e.resetRoles(b); err != nil {
			return nil, err
		}
	}
	b = append(b, '}')
	if n := int64(len(b)); n > w.resetCap.Load() && n <= 4096 {
		w.resetCap.Store(n)
	}
	if w.goStrings {
		b = goStrings(b)
	}
	return b, nil
}

// maxPerms is how many shuffled variables an episode holds the elements of.
const maxPerms = 4

// setPerm records p as the elements of variable k (nil: k is not a shuffle's).
func (e *episode) setPerm(k int, p []ref.Val) {
	free := -1
	for j, v := range e.permVar {
		switch {
		case v == k+1:
			e.permVar[j], e.perms[j] = 0, nil // drawn again
			free = j
		case v == 0 && free < 0:
			free = j
		}
	}
	if p != nil && free >= 0 {
		e.permVar[free], e.perms[free] = k+1, p
	}
}

// permOf returns the elements of variable k when a shuffle drew it, else nil.
func (e *episode) permOf(k int) []ref.Val {
	for j, v := range e.permVar {
		if v == k+1 {
			return e.perms[j]
		}
	}
	return nil
}

// typedDraw computes a drawn value of kind k by its expression's typed closure, when it
// has one of that kind and it is sure: without the boxed closure's call and the kind's
// check in between (a closure of k's type gives a value of k; a string over the
// state's bound is left to checkKind, which names it).
func typedDraw(p *program, k kind, a *activation) (ref.Val, bool) {
	switch {
	case k == kInt && p.unboxed.i != nil:
		if p.closes(a) {
			if v, ok := p.unboxed.i(a); ok {
				if checkClosures != nil {
					checkClosures(p, a, v)
				}
				return a.ep.boxInt(v), true
			}
		}
	case k == kString && p.unboxed.s != nil:
		if p.closes(a) {
			if v, ok := p.unboxed.s(a); ok && len(v) <= maxStateString {
				if checkClosures != nil {
					checkClosures(p, a, v)
				}
				return a.ep.boxString(v), true
			}
		}
	case k == kBool && p.unboxed.b != nil:
		if p.closes(a) {
			if v, ok := p.unboxed.b(a); ok {
				if checkClosures != nil {
					checkClosures(p, a, v)
				}
				return v, true
			}
		}
	}
	return nil, false
}

// maxRedraws bounds the rejections of one value's draw, so a redraw condition that always
// holds is an error, never a stalled reset.
const maxRedraws = 10000

// redraw reports whether a value's redraw condition rejects what was just drawn.
func redraw(dr *draw, act *activation, n *int) (bool, error) {
	if dr.redraw == nil {
		return false, nil
	}
	again, err := evalBool(dr.redraw, act)
	if err != nil || !again {
		*n = 0
		return false, err
	}
	if *n++; *n > maxRedraws {
		return false, &evalError{at: dr.redraw.at, err: fmt.Errorf("still rejected after %d redraws", maxRedraws)}
	}
	return true, nil
}

func drawValue(r *rand.Rand, dr *draw, act *activation) (ref.Val, error) {
	if dr.when != nil {
		ok, err := evalBool(dr.when, act)
		if err != nil {
			return nil, err
		}
		if !ok {
			if dr.els == nil {
				return dr.kind.zero(), nil
			}
			if v, ok := typedDraw(dr.els, dr.kind, act); ok {
				return v, nil
			}
			v, err := eval(dr.els, act)
			if err != nil {
				return nil, err
			}
			return checkKind(v, dr.kind, dr.els.at)
		}
	}
	switch {
	case dr.shuffle != nil:
		n, err := evalInt(dr.shuffle, act)
		if err != nil {
			return nil, err
		}
		if n < 0 || n > 10000 {
			return nil, &evalError{at: dr.shuffle.at, err: fmt.Errorf("shuffle of %d is out of range [0, 10000]", n)}
		}
		// math/rand/v2's Perm: the identity, then Fisher-Yates from the last position
		// down, each swap partner one Int64N draw.
		p := make([]ref.Val, n)
		for i := range p {
			p[i] = types.Int(i)
		}
		for i := n - 1; i > 0; i-- {
			j := r.Int64N(i + 1)
			p[i], p[j] = p[j], p[i]
		}
		act.ep.perm = p
		return types.NewRefValList(types.DefaultTypeAdapter, p), nil
	case dr.bits > 0:
		return act.ep.boxInt(types.Int(int64(r.Uint64() >> (64 - dr.bits)))), nil
	case dr.expr != nil:
		if v, ok := typedDraw(dr.expr, dr.kind, act); ok {
			return v, nil
		}
		v, err := eval(dr.expr, act)
		if err != nil {
			return nil, err
		}
		return checkKind(v, dr.kind, dr.expr.at)
	case dr.lo != nil:
		lo, err := evalInt(dr.lo, act)
		if err != nil {
			return nil, err
		}
		hi, err := evalInt(dr.hi, act)
		if err != nil {
			return nil, err
		}
		if hi < lo || hi-lo < 0 || hi-lo == math.MaxInt64 {
			return nil, &evalError{at: dr.lo.at, err: fmt.Errorf("uniform [%d, %d] is empty or too wide", lo, hi)}
		}
		return act.ep.boxInt(types.Int(lo + r.Int64N(hi-lo+1))), nil
	case len(dr.choice) > 0:
		return dr.choiceVals[r.IntN(len(dr.choiceVals))], nil
	case dr.isP:
		return types.Bool(r.Float64() < dr.p), nil
	case dr.valueVal != nil:
		return dr.valueVal, nil
	}
	return dr.kind.zero(), nil
}

// capHint caps the capacity an answer or a diff starts with (the largest of the
// episode's before): enough for most, without making every small one large.
const capHint = 512

// stepAlloc is one step's state and the signals and metering the step reports,
// allocated together, as the shop's are: one allocation where there were three.
type stepAlloc struct {
	s   stepState
	sig gauntletv1.Signals
	met gauntletv1.Metering
}

// stepState is what one step did besides its observation.
type stepState struct {
	diff       []byte
	violations []*gauntletv1.CausalViolation
	errors     uint32
	spend      int64
	// safety holds the events of the tool's safety rules that held ("event: reason").
	safety []string
	// ran: a tool's preconditions held; changed: its effects changed the state.
	ran     bool
	changed bool
	// diffCap is the capacity a diff starts with: its tool's largest before; tool
	// the tool called (nil for a bad action).
	diffCap int
	tool    *toolDef
	// reached is the highest milestone the call's reach lists reached, readReach
	// whether a reading reach reached it (a truncated answer then reaches nothing).
	reached   int
	readReach bool
	// goDone: the observation is the answer goStrings wrote (json_strings: go), which
	// a second pass would leave as it is.
	goDone bool
}

func (s *stepState) open(op, path string) {
	if len(s.diff) == 0 {
		if s.diff == nil {
			s.diff = make([]byte, 0, s.diffCap)
		}
		s.diff = append(s.diff, '[')
	} else {
		s.diff = append(s.diff, ',')
	}
	s.diff = append(s.diff, `{"op":`...)
	s.diff = canonjson.AppendString(s.diff, op)
	s.diff = append(s.diff, `,"path":`...)
	s.diff = canonjson.AppendString(s.diff, path)
}

func (s *stepState) set(path string, from, to ref.Val) {
	s.open("set", path)
	s.diff = append(s.diff, `,"from":`...)
	s.diff = appendScalar(s.diff, from)
	s.diff = append(s.diff, `,"to":`...)
	s.diff = appendScalar(s.diff, to)
	s.diff = append(s.diff, '}')
}

func (s *stepState) diffBytes(e *episode) []byte {
	if len(s.diff) == 0 {
		return []byte("[]")
	}
	if s.tool != nil {
		e.grow(s.tool, 1, len(s.diff)+1)
	}
	return append(s.diff, ']')
}

// appendScalar writes a state value (int, string or bool) as JSON.
func appendScalar(b []byte, v ref.Val) []byte {
	switch x := v.(type) {
	case types.Int:
		return strconv.AppendInt(b, int64(x), 10)
	case types.String:
		return canonjson.AppendString(b, string(x))
	case types.Bool:
		return strconv.AppendBool(b, bool(x))
	}
	return append(b, "null"...)
}

// failObs is the observation of a failed call, field for field the shop's.
func failObs(status uint32, msg string, retryAfterMs int64, rule, reason, suggestion string) []byte {
	b := []byte(`{"ok":false`)
	if status != 0 {
		b = append(b, `,"status":`...)
		b = strconv.AppendUint(b, uint64(status), 10)
	}
	b = append(b, `,"error":`...)
	b = canonjson.AppendString(b, msg)
	if retryAfterMs != 0 {
		b = append(b, `,"retry_after_ms":`...)
		b = strconv.AppendInt(b, retryAfterMs, 10)
	}
	for _, kv := range [...][2]string{{"rule", rule}, {"reason", reason}, {"suggestion", suggestion}} {
		if kv[1] != "" {
			b = append(b, ',')
			b = canonjson.AppendString(b, kv[0])
			b = append(b, ':')
			b = canonjson.AppendString(b, kv[1])
		}
	}
	return append(b, '}')
}

func (w *World) tool(name string) *toolDef {
	for i := range w.tools {
		if w.tools[i].name == name {
			return &w.tools[i]
		}
	}
	return nil
}

// cap is the capacity tool t's next answer (what 0) or diff (1) starts with.
func (e *episode) cap(t *toolDef, what int) int {
	k := 2*t.index + what
	if e.caps != nil && e.caps[k] > 0 {
		return e.caps[k]
	}
	// The tool's first call of the episode: the world's hint, from earlier episodes
	// (most calls of a tool are its first), so that it does not grow from nothing.
	if k < len(e.w.sizeHints) {
		return int(e.w.sizeHints[k].Load())
	}
	return 0
}

// grow records the size of an answer or a diff of t (capped at capHint), in the
// episode and in the world's hints.
func (e *episode) grow(t *toolDef, what, n int) {
	if e.caps == nil {
		e.caps = make([]int, 2*len(e.w.tools))
	}
	k := 2*t.index + what
	n = min(n, capHint)
	e.caps[k] = max(e.caps[k], n)
	if k < len(e.w.sizeHints) {
		h := &e.w.sizeHints[k]
		for old := h.Load(); int32(n) > old && !h.CompareAndSwap(old, int32(n)); old = h.Load() {
		}
	}
}

// argsOf returns the object a call of t reads its arguments into.
func (e *episode) argsOf(t *toolDef) *object {
	if e.argObjs == nil {
		// Every tool's object at the first call, in three allocations, not two for
		// each tool an episode calls.
		tools := e.w.tools
		n := 0
		for i := range tools {
			n += len(tools[i].args.otype.fields)
		}
		objs, vals, ptrs := make([]object, len(tools)), make([]ref.Val, n), make([]*object, len(tools))
		for i := range tools {
			k := len(tools[i].args.otype.fields)
			objs[i] = object{t: tools[i].args.otype, vals: vals[:k:k]}
			vals, ptrs[i] = vals[k:], &objs[i]
		}
		e.argObjs = ptrs
	}
	return e.argObjs[t.index]
}

// Step applies one action. Bad actions are observations; the errors are stepping before
// Reset or after the end, and an expression of the world failing on real values.
func (e *episode) Step(act env.Action) (env.StepResult, error) {
	switch {
	case !e.ready:
		return env.StepResult{}, ErrNotReset
	case e.done:
		return env.StepResult{}, fmt.Errorf("%w (%s)", ErrEpisodeOver, e.reason)
	}
	if e.ma != nil {
		return e.stepRole(act)
	}
	t := e.w.tool(act.Tool)
	var bad []byte
	if t == nil {
		bad = failObs(0, fmt.Sprintf("unknown tool %q", echo(act.Tool)), 0, "", "", "use one of: "+strings.Join(e.w.toolNames, ", "))
	}
	return e.apply(act, t, bad)
}

// apply plays one action of tool t (nil when bad, the observation of an action refused
// before its arguments were read, is set).
func (e *episode) apply(act env.Action, t *toolDef, bad []byte) (env.StepResult, error) {
	w := e.w
	al := &stepAlloc{}
	if t != nil {
		al.s.diffCap, al.s.tool = e.cap(t, 1), t
	}
	s := &al.s
	var faults []*gauntletv1.FaultFired
	var obs []byte
	start := e.clock
	calls := uint32(1)
	var args *object
	if bad == nil {
		a, err := t.args.parseInto(act.Args, e.argsOf(t))
		if err != nil {
			bad = failObs(0, err.Error(), 0, "", "", "call it as "+t.args.call)
		}
		args = a
	}
	if bad != nil {
		calls = 0
		e.invalid++
		s.errors++
		obs = bad
	} else {
		var err error
		if obs, faults, err = e.call(t, args, s); err != nil {
			e.done = true
			return env.StepResult{}, fmt.Errorf("world %s: tool %s: %w", w.name, t.name, err)
		}
	}
	var success, failure bool
	progress := max(e.progress, s.reached)
	// The end conditions read only the state unless they read the clock or the step:
	// a step that changed nothing cannot change their verdict (the first step checks the
	// state as drawn).
	if s.ran && (s.changed || e.step == 0 || w.endsReadClock) {
		for k := range w.ends {
			if w.ends[k].clock || s.changed && t.writes.intersects(w.ends[k].reads) {
				e.known[k] = false
			}
		}
		for j := range w.parts {
			if s.changed && t.writes.intersects(w.parts[j].reads) {
				e.partKnown[j] = false
			}
		}
		act := e.scope(nil)
		act.ends = true
		var err error
		if success, err = e.end(0, act); err == nil && w.failure != nil {
			failure, err = e.end(1, act)
		}
		if err == nil {
			var level int
			if level, err = e.level(act, success); err == nil {
				progress = max(progress, level)
			}
		}
		if err != nil {
			e.done = true
			return env.StepResult{}, fmt.Errorf("world %s: %w", w.name, err)
		}
	}
	if w.goStrings && !s.goDone {
		obs = goStrings(obs)
	}
	total := max(len(w.progress), 1)
	sig := &al.sig
	sig.Progress = float64(progress) / float64(total)
	sig.ProgressDelta = float64(progress-e.progress) / float64(total)
	sig.InvalidAction = calls == 0
	sig.Violations = s.violations
	sig.Success = success
	sig.Spend = float64(s.spend)
	sig.Budget = float64(e.budget)
	sig.DeadlineVirtualNs = e.deadlineMs * int64(time.Millisecond)
	sig.SafetyEvents = s.safety
	e.progress = progress
	e.step++
	met := &al.met
	met.ToolCalls = calls
	met.Errors = s.errors
	met.VirtualNs = uint64(e.clock - start)
	met.BytesIn = uint32(len(act.Args))
	met.BytesOut = uint32(len(obs))
	res := env.StepResult{
		Observation: obs,
		Diff:        s.diffBytes(e),
		Signals:     sig,
		Faults:      faults,
		Metering:    met,
	}
	env.End{
		Success: success, Failure: failure,
		Invalid: int(e.invalid), MaxInvalid: int(e.maxInvalid),
		Clock: e.clock, Deadline: time.Duration(e.deadlineMs) * time.Millisecond,
		Step: e.step, MaxSteps: e.maxSteps,
	}.Apply(&res)
	e.done, e.reason = res.Done(), res.Reason
	return res, nil
}

// end is end condition k's verdict on the current state: the last one, unless a write
// to what it reads (or the clock) made it stale.
func (e *episode) end(k int, act *activation) (bool, error) {
	if e.known[k] {
		return e.verdict[k], nil
	}
	v, err := evalBool(e.w.ends[k].p, act)
	if err != nil {
		return false, err
	}
	e.known[k], e.verdict[k] = true, v
	return v, nil
}

// level is the progress milestone the state has reached: the highest one that holds
// (without milestones, 1 on success). Progress never decreases, so milestones below
// the episode's progress are not checked (0 then).
func (e *episode) level(act *activation, success bool) (int, error) {
	if len(e.w.progress) == 0 {
		if success {
			return 1, nil
		}
		return 0, nil
	}
	for i := len(e.w.progress) - 1; i >= e.progress; i-- {
		if e.w.progress[i] == nil { // reached by tools, not a condition
			continue
		}
		ok, err := e.end(2+i, act)
		if err != nil {
			return 0, err
		}
		if ok {
			return i + 1, nil
		}
	}
	return 0, nil
}

// call runs a valid action: through the fault injector for service tools, then the tool,
// exactly as the shop does.
func (e *episode) call(t *toolDef, args *object, s *stepState) ([]byte, []*gauntletv1.FaultFired, error) {
	if t.msg {
		return e.send(t, args, s)
	}
	if t.svc < 0 {
		b, err := e.run(t, args, s)
		return b, nil, err
	}
	svc := t.svc
	name := e.w.services[svc]
	now := e.clock
	base := time.Duration(e.baseMs[svc]+e.lat.Int64N(e.baseMs[svc]/4+1)) * time.Millisecond
	if now < e.downUntil[svc] {
		e.clock += base
		wait := ceilMs(e.downUntil[svc] - now)
		s.errors++
		reason := fmt.Sprintf("%s is unavailable for another %d ms", name, wait)
		sugg := "wait retry_after_ms before calling " + name + " again"
		if o := e.w.oracle; o != nil && o.waitTool != nil {
			// The shop's words, naming the tool that waits.
			sugg = "wait retry_after_ms (the " + o.waitTool.name + " tool) before calling " + name + " again"
		}
		s.violations = append(s.violations, &gauntletv1.CausalViolation{Rule: RuleRespectRetryAfter, Reason: reason, Suggestion: sugg})
		return failObs(e.downStatus[svc], statusText(e.downStatus[svc]), wait, RuleRespectRetryAfter, reason, sugg), nil, nil
	}
	out := e.cfg.Faults.Call(name, t.name, now)
	e.clock += base + out.Latency
	if out.Status != 0 {
		s.errors++
		if out.RetryAfter > 0 {
			until := e.clock + out.RetryAfter
			s.set("services/"+name+"/unavailable_until_ns", types.Int(e.downUntil[svc]), types.Int(until))
			e.downUntil[svc], e.downStatus[svc] = until, out.Status
		}
		return failObs(out.Status, statusText(out.Status), ceilMs(out.RetryAfter), "", "", ""), out.Fired, nil
	}
	body, err := e.run(t, args, s)
	if err != nil {
		return nil, nil, err
	}
	if e.w.goStrings { // before a cut, which cuts the bytes the agent would have read
		body = goStrings(body)
		s.goDone = out.Keep >= 1 // an answer not cut is the observation: not rewritten again
	}
	if out.Keep < 1 {
		if s.readReach {
			s.reached = 0
		}
		cut := out.Truncate(body)
		b := []byte(`{"truncated":true,"body":`)
		b = canonjson.AppendString(b, string(cut))
		body = append(b, '}')
	}
	return body, out.Fired, nil
}

func ceilMs(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// statusText is the error text of an injected HTTP status, as the shop writes it.
func statusText(status uint32) string {
	switch status {
	case 400:
		return "bad request"
	case 401:
		return "unauthorized"
	case 403:
		return "forbidden"
	case 404:
		return "not found"
	case 408:
		return "request timeout"
	case 429:
		return "rate limited"
	case 500:
		return "internal server error"
	case 502:
		return "bad gateway"
	case 503:
		return "service unavailable"
	case 504:
		return "gateway timeout"
	}
	return fmt.Sprintf("http error %d", status)
}

// change is one effect, computed against the state before the step.
type change struct {
	ef    *effect
	key   string
	to    ref.Val
	added *object
}

// run checks the tool's preconditions in order; the first that fails answers the call.
// Otherwise every effect is computed against the state as it was, then applied in
// order, and the observation is computed against the new state.
func (e *episode) run(t *toolDef, args *object, s *stepState) ([]byte, error) {
	w := e.w
	act := e.scope(args)
	for i := range t.pre {
		p := &t.pre[i]
		ok, err := evalBool(p.require, act)
		if err != nil {
			return nil, err
		}
		if ok {
			continue
		}
		reason, err := render(p.reason, act)
		if err != nil {
			return nil, err
		}
		sugg, err := render(p.suggestion, act)
		if err != nil {
			return nil, err
		}
		s.errors++
		if p.rule != "" {
			s.violations = append(s.violations, &gauntletv1.CausalViolation{Rule: p.rule, Reason: reason, Suggestion: sugg})
		}
		msg, err := render(p.errT, act)
		if err != nil {
			return nil, err
		}
		return failObs(0, msg, 0, p.rule, reason, sugg), nil
	}
	s.ran = true
	// Safety rules read the state the call found, as its preconditions did: whether it
	// destroys or discloses something is judged before it does.
	for i := range t.safety {
		r := &t.safety[i]
		ok, err := evalBool(r.when, act)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		reason, err := render(r.reason, act)
		if err != nil {
			return nil, err
		}
		s.safety = append(s.safety, r.event+": "+reason)
	}
	if t.advance != nil {
		ms, err := evalInt(t.advance, act)
		if err != nil {
			return nil, err
		}
		if ms > 0 {
			e.clock += time.Duration(min(ms, math.MaxInt64/int64(time.Millisecond))) * time.Millisecond
		}
	}
	// The changes of a step are scratch: reused by the next.
	if cap(e.changes) < len(t.effects) {
		e.changes = make([]change, len(t.effects))
	}
	changes := e.changes[:len(t.effects)]
	clear(changes)
	for i := range t.effects {
		ef := &t.effects[i]
		c := change{ef: ef}
		switch {
		case ef.add:
			ed := &w.entities[ef.entity]
			c.added = newObject(ed.otype)
			for j, fp := range ef.addFields {
				k := ed.fields[j].draw.kind
				if fp == nil {
					c.added.vals[j+1] = k.zero()
					continue
				}
				v, err := eval(fp, act)
				if err != nil {
					return nil, err
				}
				if c.added.vals[j+1], err = checkKind(v, k, fp.at); err != nil {
					return nil, err
				}
			}
		default:
			if ef.key != nil {
				v, err := eval(ef.key, act)
				if err != nil {
					return nil, err
				}
				c.key = string(v.(types.String))
				if _, ok := e.ents[ef.entity].row(c.key); !ok {
					return nil, &evalError{at: ef.key.at, err: fmt.Errorf("no %s %q (add a precondition that it exists)", w.entities[ef.entity].name, clip(c.key))}
				}
			}
			v, err := eval(ef.to, act)
			if err != nil {
				return nil, err
			}
			k := kInt
			if ef.setVar >= 0 {
				k = w.vars[ef.setVar].draw.kind
			} else {
				k = w.entities[ef.entity].fields[ef.field].draw.kind
			}
			if c.to, err = checkKind(v, k, ef.to.at); err != nil {
				return nil, err
			}
		}
		changes[i] = c
	}
	var newID ref.Val = types.String("")
	// Every value was computed before the first change, and the observation is written
	// as bytes after the last: entities change in place.
	for _, c := range changes {
		ef := c.ef
		switch {
		case ef.add:
			newID = e.add(ef.entity, c.added, s)
		case ef.setVar >= 0:
			if old := e.vars[ef.setVar]; old != c.to {
				s.changed = true
				s.set(w.vars[ef.setVar].path, old, c.to)
				e.vars[ef.setVar] = c.to
			}
		default:
			ed := &w.entities[ef.entity]
			row, _ := e.ents[ef.entity].row(c.key)
			if old := row.vals[ef.field+1]; old != c.to {
				s.changed = true
				s.set(ed.path+"/"+c.key+"/"+ed.fields[ef.field].name, old, c.to)
				row.vals[ef.field+1] = c.to
			}
		}
	}
	if t.spend != nil {
		sp, err := evalInt(t.spend, act)
		if err != nil {
			return nil, err
		}
		s.spend = sp
	}
	post := act
	post.newID = newID
	// The state stays as it is now until the step ends: the reach and the answer
	// compute what they share once (the shop's search filters the catalog once, not
	// once for its total, once for its results and once for its milestone).
	clear(e.settled)
	post.settled = true
	e.settledEpoch++
	for _, r := range t.reach {
		if r.level <= s.reached {
			continue
		}
		if r.when != nil {
			ok, err := evalBool(r.when, post)
			if err != nil {
				return nil, err
			}
			if !ok {
				continue
			}
		}
		s.reached, s.readReach = r.level, r.read
	}
	// An answer is the caller's, so each is a new buffer, sized by the largest before.
	b := append(make([]byte, 0, e.cap(t, 0)), `{"ok":true`...)
	if len(t.obs) > 0 {
		b = append(b, ',')
	}
	b, err := e.appendFields(b, t.obs, post)
	if err != nil {
		return nil, err
	}
	b = append(b, '}')
	e.grow(t, 0, len(b))
	return b, nil
}

// appendFields writes an answer's keys (comma-separated, without braces).
func (e *episode) appendFields(b []byte, fields []obsField, act *activation) ([]byte, error) {
	for n := range fields {
		f := &fields[n]
		if n > 0 {
			b = append(b, ',')
		}
		b = canonjson.AppendString(b, f.key)
		b = append(b, ':')
		if f.each == nil {
			v, err := eval(f.val, act)
			if err != nil {
				return nil, err
			}
			if b, err = appendVal(b, v); err != nil {
				return nil, &evalError{at: f.val.at, err: err}
			}
			continue
		}
		v, err := eval(f.each, act)
		if err != nil {
			return nil, err
		}
		l, ok := v.(traits.Lister)
		if !ok {
			return nil, &evalError{at: f.each.at, err: fmt.Errorf("got %s, want a list", v.Type())}
		}
		b = append(b, '[')
		outer, outerElem := act.elemName, act.elem
		size := int64(l.Size().(types.Int))
		for i := range size {
			if i > 0 {
				b = append(b, ',')
			}
			act.elemName, act.elem = f.as, l.Get(types.Int(i))
			b = append(b, '{')
			if b, err = e.appendFields(b, f.fields, act); err != nil {
				return nil, err
			}
			b = append(b, '}')
		}
		act.elemName, act.elem = outer, outerElem
		b = append(b, ']')
	}
	return b, nil
}

// add adds row (its fields set, its id not yet) to entity collection k, numbering it
// after the others, and records it in the step's diff; it returns the new id.
func (e *episode) add(k int, row *object, s *stepState) ref.Val {
	ed := &e.w.entities[k]
	st := &e.ents[k]
	id := ed.prefix + strconv.Itoa(len(st.ids)+1)
	row.vals[0] = types.String(id)
	st.put(id, row)
	s.changed = true
	s.open("add", ed.path+"/"+id)
	s.diff = append(s.diff, `,"to":{`...)
	for j, f := range ed.fields {
		if j > 0 {
			s.diff = append(s.diff, ',')
		}
		s.diff = canonjson.AppendString(s.diff, f.name)
		s.diff = append(s.diff, ':')
		s.diff = appendScalar(s.diff, row.vals[j+1])
	}
	s.diff = append(s.diff, "}}"...)
	return row.vals[0]
}

func render(t template, act interpreter.Activation) (string, error) {
	if t.empty() {
		return "", nil
	}
	var sb strings.Builder
	for i, p := range t.parts {
		sb.WriteString(p)
		if i < len(t.exprs) {
			v, err := eval(t.exprs[i], act)
			if err != nil {
				return "", err
			}
			switch x := v.(type) {
			case types.String:
				sb.WriteString(string(x))
			default:
				b, err := appendVal(nil, v)
				if err != nil {
					return "", &evalError{at: t.exprs[i].at, err: err}
				}
				sb.Write(b)
			}
		}
	}
	return sb.String(), nil
}

// appendVal writes a CEL value as canonical JSON: maps with their keys sorted (an
// entity collection in the order its entities were made), lists in order.
func appendVal(b []byte, v ref.Val) ([]byte, error) {
	switch x := v.(type) {
	case types.Int:
		return strconv.AppendInt(b, int64(x), 10), nil
	case types.Uint:
		return strconv.AppendUint(b, uint64(x), 10), nil
	case types.Double:
		return canonjson.AppendFloat(b, float64(x))
	case types.String:
		return canonjson.AppendString(b, string(x)), nil
	case types.Bool:
		return strconv.AppendBool(b, bool(x)), nil
	case types.Null:
		return append(b, "null"...), nil
	case *collection:
		return appendMap(b, x, x.ids)
	case *record:
		b = append(b, '{')
		for n, i := range x.keys.order() {
			if n > 0 {
				b = append(b, ',')
			}
			b = canonjson.AppendString(b, x.keys.names[i])
			b = append(b, ':')
			var err error
			if b, err = appendVal(b, x.vals[i]); err != nil {
				return nil, err
			}
		}
		return append(b, '}'), nil
	case *object:
		b = append(b, '{')
		for n, i := range x.t.sorted {
			if n > 0 {
				b = append(b, ',')
			}
			b = canonjson.AppendString(b, x.t.fields[i])
			b = append(b, ':')
			var err error
			if b, err = appendVal(b, x.vals[i]); err != nil {
				return nil, err
			}
		}
		return append(b, '}'), nil
	case traits.Lister:
		b = append(b, '[')
		n := int64(x.Size().(types.Int))
		for i := range n {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = appendVal(b, x.Get(types.Int(i))); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case traits.Mapper:
		var keys []string
		it := x.Iterator()
		for it.HasNext() == types.True {
			k, ok := it.Next().(types.String)
			if !ok {
				return nil, errors.New("an observation's maps have string keys")
			}
			keys = append(keys, string(k))
		}
		slices.Sort(keys)
		return appendMap(b, x, keys)
	}
	return nil, fmt.Errorf("a value of type %s has no JSON form", v.Type())
}

func appendMap(b []byte, m traits.Mapper, keys []string) ([]byte, error) {
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = canonjson.AppendString(b, k)
		b = append(b, ':')
		var err error
		if b, err = appendVal(b, m.Get(types.String(k))); err != nil {
			return nil, err
		}
	}
	return append(b, '}'), nil
}
