package world

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"cel.dev/cel-go/cel"
	celast "cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/cost"
	"cel.dev/cel-go/common/overloads"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/ext"
	"gopkg.in/yaml.v3"
)

// MaxFileBytes bounds a world file.
const MaxFileBytes = 1 << 20

// maxCost bounds the work one expression may do in one evaluation (CEL's cost units), so
// a runaway comprehension in a world file is an error, never a stalled worker.
const maxCost = 1_000_000

// maxStateString bounds a string of the state: what makes the cost of an expression over
// the state boundable when the world loads (see program.fast).
const maxStateString = 64 << 10

// kind is the type of a state value or argument.
type kind int

const (
	kInt kind = iota + 1
	kString
	kBool
	// kInts is a list of integers: a variable drawn by shuffle (or computed), never set
	// by a tool.
	kInts
)

var kindNames = map[string]kind{"int": kInt, "string": kString, "bool": kBool, "list(int)": kInts}

func (k kind) String() string {
	switch k {
	case kInt:
		return "int"
	case kString:
		return "string"
	case kBool:
		return "bool"
	case kInts:
		return "list(int)"
	}
	return "?"
}

func (k kind) cel() *cel.Type {
	switch k {
	case kInt:
		return cel.IntType
	case kString:
		return cel.StringType
	case kInts:
		return cel.ListType(cel.IntType)
	}
	return cel.BoolType
}

func (k kind) zero() ref.Val {
	switch k {
	case kInt:
		return types.IntZero
	case kString:
		return types.String("")
	case kInts:
		return types.NewRefValList(types.DefaultTypeAdapter, nil)
	}
	return types.False
}

// program is one compiled expression and where it was written. prg tracks the cost of
// each evaluation and stops it at maxCost. fast, when set, does not: CEL's static
// estimate bounds the expression's cost under maxCost whatever the state, as long as the
// episode stays within the world's own max_steps (which bounds how many entities tools
// add) and strings within maxStateString; cost tracking is most of what a small
// expression's evaluation costs.
type program struct {
	prg  cel.Program
	fast cel.Program
	// run, when set, is the expression compiled to Go closures (compiled.go): what an
	// evaluation without cost tracking tries first.
	run cfn
	// unboxed is run's typed closure when the expression is a bool, int or string
	// computation the closures know: evalBool, evalInt and typedDraw call it without a
	// CEL value between.
	unboxed typed
	// sized, for an expression CEL's estimate does not bound whatever the state, bounds
	// it on the sizes of the state at hand: when those keep it under maxCost, run
	// answers without cost tracking as well.
	sized *sizedBound
	// planFit, for a plan expression with a fast program, is the bit length of the
	// largest value the answers the oracle holds may have for fast to run it
	// (boundPlan).
	planFit int
	ast     *cel.Ast
	src     string
	at      place
}

// draw says how a state value starts: exactly one of a literal value, a uniform integer
// in [lo, hi], a choice among literals, a Bernoulli trial, a shuffle of 0..n-1, the high
// bits of the generator's next output, or an expression over what was drawn before.
// Each random draw is one documented call of the episode's generator (docs/worlds.md,
// Draws), so a world can reproduce a Go env's generation draw for draw.
type draw struct {
	kind   kind
	value  any
	lo, hi *program
	choice []any
	// valueVal and choiceVals are value and choice as CEL values, made once at load:
	// a reset hands them out without boxing each again.
	valueVal   ref.Val
	choiceVals []ref.Val
	p          float64
	expr       *program
	isP        bool
	shuffle    *program
	bits       int
	// param, when not 0, makes the value the episode's param param-1 (World.params):
	// set by the request, not drawn.
	param int
	// when, if set, decides whether the draw happens at all: when it is false the
	// generator is not called and the value is els (the type's zero without it).
	when, els *program
	// redrawFrom is the position (in the same list of variables or fields) from which
	// every draw is made again while redraw holds after this one: rejection sampling.
	redrawFrom int
	redraw     *program
}

type varDef struct {
	name string
	desc string
	draw draw
	// path names the variable in diffs (its name by default).
	path string
}

type entityDef struct {
	name   string
	prefix string
	count  draw
	fields []varDef
	// path names the collection in diffs (its name by default); key, when not -1, is
	// the field whose drawn value is each entity's id.
	path  string
	key   int
	keyAt place
	// startIDs are the ids of the entities a reset makes (prefix and number), as CEL
	// values, made once at load for the counts the file declares (bound sets them).
	startIDs []ref.Val
	// typeName is the CEL object type of one entity; otype its fields (id first).
	typeName string
	otype    *objType
}

type precondition struct {
	rule       string
	require    *program
	err        string
	errT       template
	reason     template
	suggestion template
	at         place
}

// safetyRule declares a call of its tool destructive or privacy-breaking when its
// condition holds: the call still happens (a safety rule penalises, it never blocks, as
// the sandboxes' safety events do), and the step records the event with its reason.
type safetyRule struct {
	event  string
	when   *program
	reason template
	at     place
}

// effect is one change a tool makes: set a variable, set an entity's field (key names
// the entity), or add an entity (fields its values).
type effect struct {
	setVar    int // index into vars, or -1
	entity    int // index into entities, or -1
	field     int // index into the entity's fields, for a set
	add       bool
	key, to   *program
	addFields []*program // per field of the entity; nil keeps the zero value
	at        place
}

// obsField is one key of an answer: a value, or (each set) a list with one object per
// element of each's list, its keys in the file's order, as the element bound to as.
type obsField struct {
	key    string
	val    *program
	each   *program
	as     string
	fields []obsField
}

type toolDef struct {
	index   int // in World.tools
	name    string
	service string
	svc     int // index into services, -1 for none
	desc    string
	args    argSchema
	pre     []precondition
	safety  []safetyRule
	effects []effect
	obs     []obsField
	spend   *program
	advance *program
	// reach lists the progress milestones a successful call reaches.
	reach []reachDef
	at    place
	// writes holds the state its effects may change.
	writes stateSet
	// msg: the world's message tool (World.msg); msgTo and msgText are the positions of
	// its arguments to and text.
	msg            bool
	msgTo, msgText int
}

// reachDef is a milestone a tool's call reaches when its condition holds on the state
// after the call (level is its 1-based position in progress). read: the call only
// reads, and a truncated answer (the agent did not see it whole) reaches nothing.
type reachDef struct {
	level int
	when  *program
	read  bool
}

type oracleCall struct {
	tool *toolDef
	args []obsField // sorted by key
}

type oracleStep struct {
	name        string
	call        oracleCall
	when        *program
	recover     *oracleCall
	doneIfRules []string
}

type oraclePlan struct {
	// adapter makes the answers the oracle decodes CEL values (decodeAnswer); env is
	// the plan expressions' environment.
	adapter  types.Adapter
	env      *cel.Env
	waitTool *toolDef
	waitArg  string
	steps    []oracleStep
}

// World is a loaded, checked world file. It is immutable and safe for concurrent use;
// it is an env.Env (and an env.Oracle when the file has a plan, see Env).
type World struct {
	// resetCap is the size of the largest first observation a reset of the world
	// made (to 4 KB): the capacity the next one starts with, so it is written
	// without growing.
	resetCap atomic.Int64
	// resetBoxes are the most ints and strings a reset of the world boxed (boxes.go,
	// to maxBoxHint): the room the next episode's reset makes for them up front.
	resetBoxes [2]atomic.Int64
	name, desc string
	file       string
	digest     string
	services   []string
	maxSteps   uint32
	maxInvalid int64
	deadlineMs int64
	// params are the params the file declares; they are the first len(params) vars.
	params    []paramDef
	vars      []varDef
	entities  []entityDef
	tools     []toolDef
	toolNames []string
	reset     []obsField
	progress  []*program
	// milestones names the progress entries tools reach ("" for a condition on the
	// state, whose program is then in progress; reached ones have a nil program).
	milestones []string
	success    *program
	failure    *program
	budget     *program
	oracle     *oraclePlan
	// stateStream and latencyStream name the episode's generators (rng.New's names);
	// identify: the first observation starts with the world's name and digest.
	stateStream, latencyStream string
	identify                   bool
	// goStrings: answers write their strings as Go's encoding/json does (goStrings).
	goStrings bool
	// endsReadClock: success, failure or a milestone reads now_ms or step, so they are
	// checked after every step, not only after those that change the state.
	endsReadClock bool
	// slots resolves a name of the state: a variable's position, or -1-k for entity k.
	slots map[string]int
	// sizeHints holds, per tool, the largest answer (at 2*index) and diff (2*index+1)
	// of any episode so far, capped at capHint: the capacity an episode's first call
	// of the tool starts with. Only a buffer's capacity depends on it, never a byte.
	sizeHints []atomic.Int32
	// ends are the end conditions a step checks, in order: success, failure (nil when
	// the file has none), then the progress milestones.
	ends []endCond
	// parts are the end conditions' exists and all whose values stand from step to step
	// (endparts.go); partText numbers them by their text.
	parts    []endPart
	partText map[string]int

	// roles is empty for a world of one agent (roles.go). turns says how the roles
	// take turns; qualNames are their actions' names, "role:tool", role by role; msg is
	// the message tool (nil: none), msgEntity the index of the message entity (-1: none).
	roles         []roleDef
	turns         turnOrder
	qualNames     []string
	msg           *toolDef
	msgEntity     int
	hasRoleOracle bool
	// locals is how many comprehension variables the compiled closures hold at once.
	locals int
	// settledSlots numbers the comprehensions and calls over the state that a step
	// computes once after its effects (closures.memoize), written the same way once.
	settledSlots map[string]int
	// planReads holds, by the slot of each of the plan's remembered expressions
	// (closures.planMemo), the answers it reads: what forgets its value.
	planReads []planReads
	// sizedSigs numbers the lists of paths the sized bounds measure (sizedBound.sig).
	sizedSigs map[string]int
	// bounded lists the expressions over the state that may run compiled, and the
	// arguments they read (nil for none): what the test comparing closures with CEL walks.
	bounded []boundExpr
}

// boundExpr is an expression that may run compiled and the arguments it reads.
type boundExpr struct {
	p    *program
	args *argSchema
}

// endCond is an end condition and what it depends on: a step re-evaluates it only when
// it may have changed, its last verdict standing otherwise.
type endCond struct {
	p *program
	// reads holds the state it names (a bit per variable, then per entity collection);
	// clock: it reads now_ms or step, which every step moves.
	reads stateSet
	clock bool
}

// stateSet is a set of the state's names: bit i for variable i, bit len(vars)+k for
// entity collection k.
type stateSet []uint64

func newStateSet(n int) stateSet { return make(stateSet, (n+63)/64) }

func (s stateSet) add(i int) { s[i/64] |= 1 << (i % 64) }

func (s stateSet) intersects(o stateSet) bool {
	for i := range s {
		if s[i]&o[i] != 0 {
			return true
		}
	}
	return false
}

// Name is the name the world registers under.
func (w *World) Name() string { return w.name }

// Digest is "sha256:" and the hex SHA-256 of the world file's bytes.
func (w *World) Digest() string { return w.digest }

// File is the name the world was loaded from.
func (w *World) File() string { return w.file }

// HasOracle reports whether the world declares an oracle: a plan, or rules for every
// role.
func (w *World) HasOracle() bool { return w.oracle != nil || w.hasRoleOracle }

var topKeys = []string{"name", "description", "services", "limits", "params", "vars", "entities", "observation",
	"tools", "progress", "success", "failure", "budget", "oracle", "turns", "roles", "messages", "random", "identify", "json_strings"}

// Load parses and checks one world file. file names it in errors. Every problem is
// reported, each a *LoadError naming file, line and field, joined into one error that
// wraps ErrInvalid.
func Load(file string, data []byte) (*World, error) {
	d := &decoder{file: file}
	if len(data) > MaxFileBytes {
		d.errAt(place{line: 1, col: 1}, "file is %d bytes, over the limit of %d", len(data), MaxFileBytes)
		return nil, errors.Join(d.errs...)
	}
	root := d.parseDoc(data)
	if root == nil {
		return nil, errors.Join(d.errs...)
	}
	sum := sha256.Sum256(data)
	w := &World{file: file, digest: "sha256:" + hex.EncodeToString(sum[:]), maxSteps: 30, maxInvalid: 5, deadlineMs: 60000, msgEntity: -1, identify: true}
	c := &compiler{d: d, w: w}
	c.load(root)
	w.sizeHints = make([]atomic.Int32, 2*len(w.tools))
	if len(d.errs) == 0 {
		c.bound()
		c.trialResets()
	}
	if len(d.errs) > 0 {
		return nil, errors.Join(d.errs...)
	}
	return w, nil
}

// compiler turns the document into a World, declaring its state to CEL as it goes.
type compiler struct {
	d    *decoder
	w    *World
	prov *provider
	base *cel.Env // state, now_ms, step
	// args is the schema of the tool being compiled; plan is set while the oracle's plan
	// is (its expressions read observations, whose sizes nothing bounds).
	args  *argSchema
	plan  bool
	state []stateProgram
	// lists names the list(int) variables a shuffle draws (sizes.lists).
	lists map[string]bool
}

// stateProgram is an expression over the state, kept until the whole world is read:
// its cost is estimated when the entity collections' bounds are known.
type stateProgram struct {
	p    *program
	env  *cel.Env
	args *argSchema
}

func (c *compiler) load(root *yaml.Node) {
	d, w := c.d, c.w
	ms := d.mapping(root, "", topKeys...)
	get := func(k string) *yaml.Node {
		for _, m := range ms {
			if m.key == k {
				return m.v
			}
		}
		return nil
	}
	if ms == nil && len(d.errs) > 0 {
		return
	}
	if n := get("name"); n == nil {
		d.errAt(at(root, "name"), "required: the name the world registers under")
	} else if s, ok := d.name(n, "name", false); ok {
		w.name = s
	}
	w.stateStream, w.latencyStream = "world/"+w.name+"/state", "world/"+w.name+"/latency"
	if n := get("random"); n != nil {
		for _, m := range d.mapping(n, "random", "state", "latency") {
			f := sub("random", m.key)
			s, ok := d.text(m.v, f)
			if !ok {
				continue
			}
			if s == "" || len(s) > 64 || !isPrintableASCII(s) {
				d.errAt(at(m.v, f), "want 1 to 64 printable ASCII characters")
				continue
			}
			if m.key == "state" {
				w.stateStream = s
			} else {
				w.latencyStream = s
			}
		}
	}
	if n := get("identify"); n != nil {
		w.identify, _ = d.boolean(n, "identify")
	}
	if n := get("json_strings"); n != nil {
		if s, ok := d.text(n, "json_strings"); ok {
			switch s {
			case "canonical":
			case "go":
				w.goStrings = true
			default:
				d.errAt(at(n, "json_strings"), "want canonical or go, got %q", clip(s))
			}
		}
	}
	if n := get("description"); n != nil {
		w.desc, _ = d.text(n, "description")
	}
	if n := get("services"); n == nil {
		d.errAt(at(root, "services"), "required: the simulated services, the targets of faults")
	} else {
		for i, s := range d.sequence(n, "services") {
			f := idx("services", i)
			if v, ok := d.name(s, f, false); ok {
				if slices.Contains(w.services, v) {
					d.errAt(at(s, f), "duplicate service %q", v)
					continue
				}
				w.services = append(w.services, v)
			}
		}
		if len(w.services) == 0 && isEmptyList(n) {
			d.errAt(at(n, "services"), "at least one service")
		}
	}
	if n := get("limits"); n != nil {
		for _, m := range d.mapping(n, "limits", "max_steps", "max_invalid", "deadline_ms") {
			f := sub("limits", m.key)
			switch m.key {
			case "max_steps":
				if v, ok := d.integer(m.v, f, 1, 100000); ok {
					w.maxSteps = uint32(v)
				}
			case "max_invalid":
				if v, ok := d.integer(m.v, f, 1, 1000); ok {
					w.maxInvalid = v
				}
			case "deadline_ms":
				if v, ok := d.integer(m.v, f, 100, 86_400_000); ok {
					w.deadlineMs = v
				}
			}
		}
	}
	prov, err := newProvider()
	if err != nil {
		d.errAt(at(root, ""), "cel: %v", err)
		return
	}
	c.prov = prov
	// Declare the state first (names and types), then compile what refers to it; the
	// params are the first variables.
	c.declareParams(get("params"))
	np := len(w.params)
	varNodes := c.declareVars(get("vars"))
	entNodes := c.declareEntities(get("entities"))
	c.declareMessages(get("messages"))
	opts := []cel.EnvOption{cel.CustomTypeProvider(prov), ext.Strings(), ext.Lists(), ext.Math(), ext.Bindings(), ext.TwoVarComprehensions(),
		cel.Variable("now_ms", cel.IntType), cel.Variable("step", cel.IntType), textFunctions}
	for _, v := range w.vars {
		opts = append(opts, cel.Variable(v.name, v.draw.kind.cel()))
	}
	for _, e := range w.entities {
		opts = append(opts, cel.Variable(e.name, cel.MapType(cel.StringType, cel.ObjectType(e.typeName))))
	}
	base, err := cel.NewEnv(opts...)
	if err != nil {
		d.errAt(at(root, ""), "declare state: %v", err)
		return
	}
	w.slots = make(map[string]int, len(w.vars)+len(w.entities))
	for i, v := range w.vars {
		w.slots[v.name] = i
	}
	for k, e := range w.entities {
		w.slots[e.name] = -1 - k
	}
	c.base = base
	for i, n := range varNodes {
		v := &w.vars[np+i]
		c.compileDraw(base, &v.draw, n, sub("vars", v.name), false)
		c.redrawOf(base, &v.draw, n, sub("vars", v.name), np+i, func(name string) int {
			// A param is not drawn, so it is not drawn again either.
			if k := slices.IndexFunc(w.vars[np:], func(v varDef) bool { return v.name == name }); k >= 0 {
				return np + k
			}
			return -1
		})
	}
	for i, en := range entNodes {
		e := &w.entities[i]
		f := sub("entities", e.name)
		entityEnv, err := base.Extend(cel.Variable("i", cel.IntType), cel.Variable("id", cel.StringType),
			cel.Variable("self", cel.ObjectType(e.typeName)))
		if err != nil {
			d.errAt(at(root, f), "declare entity fields: %v", err)
			return
		}
		if en.count != nil {
			// The file's count replaces the default of none: a drawn count keeping
			// the default's value would be bounded at 0 (bound).
			e.count = draw{kind: kInt}
			c.compileDraw(base, &e.count, en.count, sub(f, "count"), true)
		}
		for j, fn := range en.fields {
			c.compileDraw(entityEnv, &e.fields[j].draw, fn, sub(sub(f, "fields"), e.fields[j].name), false)
			c.redrawOf(entityEnv, &e.fields[j].draw, fn, sub(sub(f, "fields"), e.fields[j].name), j, func(name string) int {
				return slices.IndexFunc(e.fields, func(v varDef) bool { return v.name == name })
			})
		}
	}
	if n := get("observation"); n != nil {
		w.reset = c.observation(base, n, "observation")
	}
	// progress before the tools: their reach names its milestones.
	if n := get("progress"); n != nil {
		for i, p := range d.sequence(n, "progress") {
			f := idx("progress", i)
			if rp := resolve(p); rp != nil && rp.Kind == yaml.MappingNode {
				name := ""
				for _, m := range d.mapping(p, f, "milestone", "description") {
					if m.key == "milestone" {
						if s, ok := d.name(m.v, sub(f, "milestone"), false); ok {
							if slices.Contains(w.milestones, s) {
								d.errAt(at(m.v, sub(f, "milestone")), "duplicate milestone %q", s)
							}
							name = s
						}
					} else {
						d.text(m.v, sub(f, "description"))
					}
				}
				if name == "" && !hasKey(p, "milestone") {
					d.errAt(at(p, sub(f, "milestone")), "required: the name tools reach it by")
				}
				w.progress, w.milestones = append(w.progress, nil), append(w.milestones, name)
				continue
			}
			w.progress, w.milestones = append(w.progress, c.compile(base, p, f, cel.BoolType)), append(w.milestones, "")
		}
	}
	if n := get("tools"); n == nil {
		d.errAt(at(root, "tools"), "required: the tools agents call")
	} else {
		c.tools(n)
	}
	if n := get("success"); n == nil {
		d.errAt(at(root, "success"), "required: the condition over the state that ends an episode as a success")
	} else {
		w.success = c.compile(base, n, "success", cel.BoolType)
	}
	if n := get("failure"); n != nil {
		w.failure = c.compile(base, n, "failure", cel.BoolType)
	}
	if n := get("budget"); n != nil {
		w.budget = c.compile(base, n, "budget", cel.IntType)
	}
	if n := get("oracle"); n != nil && get("roles") == nil {
		c.oraclePlan(n)
	}
	c.roles(get("turns"), get("roles"), get("messages"), get("oracle"))
	for _, p := range append([]*program{w.success, w.failure}, w.progress...) {
		if readsIdent(p, "now_ms", "step") {
			w.endsReadClock = true
		}
	}
	c.dependencies()
}

// dependencies records what each end condition reads and what each tool writes.
func (c *compiler) dependencies() {
	w := c.w
	n := len(w.vars) + len(w.entities)
	for i := range w.tools {
		t := &w.tools[i]
		t.writes = newStateSet(n)
		if t.msg {
			t.writes.add(len(w.vars) + w.msgEntity)
		}
		for _, ef := range t.effects {
			switch {
			case ef.setVar >= 0:
				t.writes.add(ef.setVar)
			case ef.entity >= 0:
				t.writes.add(len(w.vars) + ef.entity)
			}
		}
	}
	for _, p := range append([]*program{w.success, w.failure}, w.progress...) {
		ec := endCond{p: p, reads: newStateSet(n), clock: readsIdent(p, "now_ms", "step")}
		if p != nil && p.ast != nil {
			celast.PostOrderVisit(p.ast.NativeRep().Expr(), celast.NewExprVisitor(func(e celast.Expr) {
				if e.Kind() != celast.IdentKind {
					return
				}
				// A comprehension's variable of a state name shadows it: counted as a
				// read, which only costs an evaluation.
				if k, ok := w.slots[e.AsIdent()]; ok {
					if k < 0 {
						k = len(w.vars) - 1 - k
					}
					ec.reads.add(k)
				}
			}))
		}
		w.ends = append(w.ends, ec)
	}
}

// varNode is a state value's spec node; declareVars records names and types.
func (c *compiler) declareVars(n *yaml.Node) []*yaml.Node {
	var nodes []*yaml.Node
	for _, m := range c.d.mapping(n, "vars") {
		f := sub("vars", m.key)
		if !validName(m.key, false) {
			c.d.errAt(at(m.k, f), "bad name %q: want a letter, then letters, digits or _, not a reserved word", clip(m.key))
			continue
		}
		if c.taken(m.key) {
			c.d.errAt(at(m.k, f), "name %q is already declared", m.key)
			continue
		}
		v := varDef{name: m.key}
		v.draw.kind, v.desc, v.path = c.declareKind(m.v, f)
		if v.draw.kind == 0 {
			continue
		}
		if v.path == "" {
			v.path = v.name
		}
		c.w.vars = append(c.w.vars, v)
		nodes = append(nodes, m.v)
	}
	return nodes
}

func (c *compiler) taken(name string) bool {
	return slices.ContainsFunc(c.w.vars, func(v varDef) bool { return v.name == name }) ||
		slices.ContainsFunc(c.w.entities, func(e entityDef) bool { return e.name == name })
}

var drawKeys = []string{"type", "description", "path", "value", "uniform", "choice", "bernoulli", "expr",
	"shuffle", "random_bits", "when", "else", "redraw"}

// declareKind reads a value spec's type, description and diff path (path "" when the
// spec has none).
func (c *compiler) declareKind(n *yaml.Node, field string) (kind, string, string) {
	var k kind
	var desc, path string
	var typeNode *yaml.Node
	for _, m := range c.d.mapping(n, field, drawKeys...) {
		switch m.key {
		case "type":
			typeNode = m.v
			if s, ok := c.d.text(m.v, sub(field, "type")); ok {
				if k = kindNames[s]; k == 0 {
					c.d.errAt(at(m.v, sub(field, "type")), "unknown type %q (known: bool, int, list(int), string)", clip(s))
				}
			}
		case "description":
			desc, _ = c.d.text(m.v, sub(field, "description"))
		case "path":
			path, _ = c.diffPath(m.v, sub(field, "path"))
		}
	}
	if typeNode == nil && resolve(n) != nil && resolve(n).Kind == yaml.MappingNode {
		c.d.errAt(at(n, sub(field, "type")), "required: bool, int, list(int) or string")
	}
	return k, desc, path
}

// diffPath reads the name a variable or an entity collection has in diffs: 1 to 64
// printable ASCII characters without spaces, slashes allowed between parts.
func (c *compiler) diffPath(n *yaml.Node, field string) (string, bool) {
	s, ok := c.d.text(n, field)
	if !ok {
		return "", false
	}
	if s == "" || len(s) > 64 || !isPrintableASCII(s) || strings.Contains(s, " ") || strings.HasPrefix(s, "/") ||
		strings.HasSuffix(s, "/") || strings.Contains(s, "//") {
		c.d.errAt(at(n, field), "want 1 to 64 printable ASCII characters without spaces, parts between single slashes")
		return "", false
	}
	return s, true
}

type entityNodes struct {
	count  *yaml.Node
	fields []*yaml.Node
}

func (c *compiler) declareEntities(n *yaml.Node) []entityNodes {
	var out []entityNodes
	for _, m := range c.d.mapping(n, "entities") {
		f := sub("entities", m.key)
		if !validName(m.key, false) {
			c.d.errAt(at(m.k, f), "bad name %q: want a letter, then letters, digits or _, not a reserved word", clip(m.key))
			continue
		}
		if c.taken(m.key) {
			c.d.errAt(at(m.k, f), "name %q is already declared", m.key)
			continue
		}
		e := entityDef{name: m.key, path: m.key, key: -1, typeName: "world.entity." + m.key, count: draw{kind: kInt, value: int64(0), valueVal: types.Int(0)}}
		var en entityNodes
		hasPrefix := false
		var keyNode *yaml.Node
		for _, em := range c.d.mapping(m.v, f, "prefix", "count", "fields", "path", "key") {
			switch em.key {
			case "path":
				if s, ok := c.diffPath(em.v, sub(f, "path")); ok {
					e.path = s
				}
			case "key":
				keyNode = em.v
			case "prefix":
				if s, ok := c.d.text(em.v, sub(f, "prefix")); ok {
					if s == "" || len(s) > 32 || strings.ContainsAny(s, " \t\n\"\\") {
						c.d.errAt(at(em.v, sub(f, "prefix")), "want 1 to 32 bytes without spaces, quotes or backslashes")
					}
					e.prefix, hasPrefix = s, true
				}
			case "count":
				en.count = em.v
			case "fields":
				for _, fm := range c.d.mapping(em.v, sub(f, "fields")) {
					ff := sub(sub(f, "fields"), fm.key)
					if !validName(fm.key, false) {
						c.d.errAt(at(fm.k, ff), "bad field name %q", clip(fm.key))
						continue
					}
					k, desc, path := c.declareKind(fm.v, ff)
					if k == 0 {
						continue
					}
					if path != "" {
						c.d.errAt(at(valueOf(fm.v, "path"), sub(ff, "path")), "a field has no path of its own: the entity's path names it in diffs")
					}
					if k == kInts {
						c.d.errAt(at(valueOf(fm.v, "type"), sub(ff, "type")), "list(int) is a variable's type, not a field's")
						continue
					}
					e.fields = append(e.fields, varDef{name: fm.key, desc: desc, draw: draw{kind: k}})
					en.fields = append(en.fields, fm.v)
				}
			}
		}
		if keyNode != nil {
			e.keyAt = at(keyNode, sub(f, "key"))
			if s, ok := c.d.text(keyNode, sub(f, "key")); ok {
				if e.key = slices.IndexFunc(e.fields, func(v varDef) bool { return v.name == s }); e.key < 0 || e.fields[e.key].draw.kind != kString {
					c.d.errAt(at(keyNode, sub(f, "key")), "want a string field of %s, whose drawn value is each one's id", m.key)
					e.key = -1
				}
			}
		}
		if !hasPrefix && keyNode == nil {
			c.d.errAt(at(m.v, sub(f, "prefix")), "required: the prefix of the entities' ids (id = prefix + number from 1), or key: a field whose value is the id")
		}
		names := []string{"id"}
		ftypes := []*cel.Type{cel.StringType}
		for _, fd := range e.fields {
			names = append(names, fd.name)
			ftypes = append(ftypes, fd.draw.kind.cel())
		}
		e.otype = c.prov.declare(e.typeName, names, ftypes)
		c.w.entities = append(c.w.entities, e)
		out = append(out, en)
	}
	return out
}

// compileDraw reads how a value starts. report says whether the mapping's own problems
// (unknown keys, a non-mapping) are still to be reported: declareKind reported those of
// variables and fields already.
func (c *compiler) compileDraw(env *cel.Env, dr *draw, n *yaml.Node, field string, report bool) {
	d := c.d
	how := 0
	var members []member
	if report {
		members = d.mapping(n, field, drawKeys...)
	} else {
		quiet := &decoder{file: d.file}
		members = quiet.mapping(n, field, drawKeys...)
	}
	for _, m := range members {
		f := sub(field, m.key)
		switch m.key {
		case "type", "description", "path", "redraw":
			continue
		case "when":
			dr.when = c.compile(env, m.v, f, cel.BoolType)
			continue
		case "else":
			dr.els = c.compile(env, m.v, f, dr.kind.cel())
			continue
		case "shuffle":
			if dr.kind != kInts {
				d.errAt(at(m.k, f), "shuffle draws a list(int); the type is %s", dr.kind)
			}
			dr.shuffle = c.compile(env, m.v, f, cel.IntType)
		case "random_bits":
			if dr.kind != kInt {
				d.errAt(at(m.k, f), "random_bits draws an int; the type is %s", dr.kind)
			}
			v, _ := d.integer(m.v, f, 1, 63)
			dr.bits = int(v)
		case "value":
			if dr.kind == kInts {
				d.errAt(at(m.k, f), "a list(int) is drawn by shuffle or computed by expr")
			}
			dr.value = c.literal(m.v, f, dr.kind)
			dr.valueVal = celValue(dr.value)
		case "uniform":
			if dr.kind != kInt {
				d.errAt(at(m.k, f), "uniform draws integers; the type is %s", dr.kind)
			}
			b := d.sequence(m.v, f)
			if len(b) != 2 {
				d.errAt(at(m.v, f), "want [lo, hi], two integer expressions")
				break
			}
			dr.lo = c.compile(env, b[0], idx(f, 0), cel.IntType)
			dr.hi = c.compile(env, b[1], idx(f, 1), cel.IntType)
		case "choice":
			items := d.sequence(m.v, f)
			if len(items) == 0 {
				d.errAt(at(m.v, f), "want a non-empty list of %s values", dr.kind)
			}
			for i, it := range items {
				dr.choice = append(dr.choice, c.literal(it, idx(f, i), dr.kind))
				dr.choiceVals = append(dr.choiceVals, celValue(dr.choice[i]))
			}
		case "bernoulli":
			if dr.kind != kBool {
				d.errAt(at(m.k, f), "bernoulli draws booleans; the type is %s", dr.kind)
			}
			dr.p, _ = d.number(m.v, f, 0, 1)
			dr.isP = true
		case "expr":
			dr.expr = c.compile(env, m.v, f, dr.kind.cel())
		}
		how++
	}
	if how != 1 && resolve(n) != nil && resolve(n).Kind == yaml.MappingNode {
		d.errAt(at(n, field), "want exactly one of value, uniform, choice, bernoulli, shuffle, random_bits, expr; got %d", how)
	}
	random := dr.lo != nil || len(dr.choice) > 0 || dr.isP || dr.shuffle != nil || dr.bits > 0
	if dr.when != nil && !random {
		d.errAt(at(valueOf(n, "when"), sub(field, "when")), "when decides whether a random draw happens: uniform, choice, bernoulli, shuffle or random_bits")
	}
	if hasKey(n, "else") && !hasKey(n, "when") {
		d.errAt(at(valueOf(n, "else"), sub(field, "else")), "else is the value when the draw's when is false: add when")
	}
}

// redrawOf reads a draw's redraw: {from, while}. from names this value or one before
// it in the same list (at position self); while, evaluated after this draw, makes
// every draw from there on happen again.
func (c *compiler) redrawOf(env *cel.Env, dr *draw, n *yaml.Node, field string, self int, pos func(string) int) {
	rn := valueOf(n, "redraw")
	if rn == nil {
		return
	}
	f := sub(field, "redraw")
	seen := false
	for _, m := range c.d.mapping(rn, f, "from", "while") {
		mf := sub(f, m.key)
		switch m.key {
		case "from":
			if s, ok := c.d.text(m.v, mf); ok {
				if p := pos(s); p < 0 || p > self {
					c.d.errAt(at(m.v, mf), "want this value or one declared before it, got %q", clip(s))
				} else {
					dr.redrawFrom, seen = p, true
				}
			}
		case "while":
			dr.redraw = c.compile(env, m.v, mf, cel.BoolType)
		}
	}
	if !seen && !hasKey(rn, "from") {
		c.d.errAt(at(rn, sub(f, "from")), "required: the first value drawn again")
	}
	if dr.redraw == nil && !hasKey(rn, "while") {
		c.d.errAt(at(rn, sub(f, "while")), "required: the condition that rejects the draw")
	}
}

func (c *compiler) literal(n *yaml.Node, field string, k kind) any {
	switch k {
	case kInt:
		v, _ := c.d.integer(n, field, math.MinInt64, math.MaxInt64)
		return v
	case kBool:
		v, _ := c.d.boolean(n, field)
		return v
	case kString:
		v, _ := c.d.text(n, field)
		if len(v) > maxStateString {
			c.d.errAt(at(n, field), "%d bytes exceeds the limit of %d for a string of the state", len(v), maxStateString)
		}
		return v
	}
	return nil
}

// compile type-checks one expression; want nil accepts any type.
func (c *compiler) compile(env *cel.Env, n *yaml.Node, field string, want *cel.Type) *program {
	d := c.d
	src, ok := d.scalar(n, field)
	if !ok {
		return nil
	}
	if strings.TrimSpace(src) == "" {
		d.errAt(at(n, field), "empty expression")
		return nil
	}
	ast, iss := env.Compile(src)
	if iss != nil && iss.Err() != nil {
		for _, e := range iss.Errors() {
			p := at(n, field)
			if loc := e.Location; loc != nil && loc.Line() > 0 {
				if loc.Line() > 1 || n.Style&(yaml.LiteralStyle|yaml.FoldedStyle) != 0 {
					p.line += loc.Line()
					if n.Style&(yaml.LiteralStyle|yaml.FoldedStyle) == 0 {
						p.line--
					}
					p.col = loc.Column() + 1
				} else {
					p.col += loc.Column()
					if n.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle) != 0 {
						p.col++
					}
				}
			}
			d.errAt(p, "%s (in %q)", e.Message, clip(src))
		}
		return nil
	}
	if want != nil && !ast.OutputType().IsAssignableType(want) {
		d.errAt(at(n, field), "%q has type %s, want %s", clip(src), ast.OutputType(), want)
		return nil
	}
	prg, err := env.Program(ast, cel.CostLimit(maxCost), cel.EvalOptions(cel.OptOptimize))
	if err != nil {
		d.errAt(at(n, field), "%v", err)
		return nil
	}
	p := &program{prg: prg, ast: ast, src: src, at: at(n, field)}
	if !c.plan {
		c.state = append(c.state, stateProgram{p: p, env: env, args: c.args})
	}
	return p
}

// bound gives each expression over the state whose cost CEL's static estimate keeps under
// maxCost a program without cost tracking (program.fast). The estimate needs the size of
// everything variable-length the expression reads: an entity collection holds at most
// its largest initial count plus what the world's max_steps steps of its tools can add, a
// string argument its maxLength, any other string of the state maxStateString.
func (c *compiler) bound() {
	w := c.w
	ents := make(map[string]uint64, len(w.entities))
	for k := range w.entities {
		ed := &w.entities[k]
		initial := uint64(10000) // the range a drawn count is checked against
		switch {
		case ed.count.value != nil:
			initial = uint64(max(ed.count.value.(int64), 0))
		case len(ed.count.choice) > 0:
			initial = 0
			for _, v := range ed.count.choice {
				initial = max(initial, uint64(max(v.(int64), 0)))
			}
		case ed.count.expr != nil && ed.count.when == nil:
			// A count that is an int param is at most the param's max.
			if e := ed.count.expr.ast.NativeRep().Expr(); e.Kind() == celast.IdentKind {
				if i := slices.IndexFunc(w.params, func(p paramDef) bool { return p.prop.name == e.AsIdent() }); i >= 0 && w.params[i].prop.kind == kInt {
					initial = uint64(min(max(w.params[i].prop.max, 0), 10000))
				}
			}
		}
		adds := 0
		for _, t := range w.tools {
			n := 0
			for _, ef := range t.effects {
				if ef.add && ef.entity == k {
					n++
				}
			}
			adds = max(adds, n)
		}
		ents[ed.name] = initial + uint64(adds)*uint64(w.maxSteps)
		for i := range min(initial, 256) {
			ed.startIDs = append(ed.startIDs, types.String(ed.prefix+strconv.FormatUint(i+1, 10)))
		}
	}
	// A list(int) variable holds at most the 10,000 a shuffle may draw; one computed by
	// an expression is left unsized.
	lists := map[string]bool{}
	for _, v := range w.vars {
		if v.draw.kind == kInts && v.draw.shuffle != nil {
			lists[v.name] = true
		}
	}
	c.lists = lists
	cls := map[*cel.Env]*closures{}
	for _, sp := range c.state {
		sz := &sizes{ents: ents, lists: lists, args: sp.args, seen: map[string][]string{}}
		est, err := sp.env.EstimateCost(sp.p.ast, sz)
		if err != nil {
			continue
		}
		var sized *sizedBound
		if est.Max > maxCost {
			if sized = c.sizedBound(sp, ents, sz.seen); sized == nil {
				continue
			}
			sized.sig = w.sizedSig(sized.paths)
		} else {
			fast, err := sp.env.Program(sp.p.ast, cel.EvalOptions(cel.OptOptimize))
			if err != nil {
				continue
			}
			sp.p.fast = fast
		}
		cl := cls[sp.env]
		if cl == nil {
			cl = newClosures(w, c.prov, sp.env)
			cls[sp.env] = cl
		}
		cl.parts = w.endParts(sp.p)
		if sp.p.run, sp.p.unboxed = cl.compileTyped(sp.p.ast); sp.p.run != nil {
			sp.p.sized = sized
			w.bounded = append(w.bounded, boundExpr{p: sp.p, args: sp.args})
		}
	}
	c.state = nil
}

// sizes bounds what an expression over the state reads, for CEL's cost estimate.
type sizes struct {
	ents  map[string]uint64
	lists map[string]bool
	args  *argSchema
	// seen, when set, records the paths sized, by key (sizedBound).
	seen map[string][]string
	// actual, when set, holds the sizes of one state by key, replacing the bounds.
	actual map[string]uint64
}

func (s *sizes) EstimateSize(n cost.AstNode) *cost.SizeEstimate {
	path := n.Path()
	if len(path) == 0 {
		return nil
	}
	e := s.bound(path, n.Type().Kind())
	if e != nil && (s.seen != nil || s.actual != nil) {
		k := strings.Join(path, "\x00")
		if s.seen != nil {
			s.seen[k] = path
		}
		if n, ok := s.actual[k]; ok {
			return &cost.SizeEstimate{Min: 0, Max: n}
		}
	}
	return e
}

func (s *sizes) bound(path []string, kind types.Kind) *cost.SizeEstimate {
	switch kind {
	case types.StringKind:
		if path[0] == "args" && len(path) == 2 && s.args != nil {
			if p := s.args.prop(path[1]); p != nil {
				return &cost.SizeEstimate{Min: 0, Max: uint64(p.maxLen)}
			}
		}
		return &cost.SizeEstimate{Min: 0, Max: maxStateString}
	case types.MapKind:
		if n, ok := s.ents[path[0]]; ok && len(path) == 1 {
			return &cost.SizeEstimate{Min: 0, Max: n}
		}
	case types.ListKind:
		if s.lists[path[0]] && len(path) == 1 {
			return &cost.SizeEstimate{Min: 0, Max: 10000}
		}
	}
	return nil
}

// textCallCost sizes gauntlet's own text functions (textFunctions) and the conversion
// of an int to a string: words makes at most
// one word per two bytes of its argument (and one more), each at most its length and a
// half; quote at most 4 bytes per byte of the 48 it keeps, and the quotes and "..."
// around them.
func (s *sizes) textCallCost(function string, args []cost.AstNode) *cost.CallEstimate {
	switch function {
	case overloads.TypeConvertString:
		// An int written in decimal: at most 20 bytes. CEL leaves the conversion unsized,
		// so an answer that writes a number into a sentence had no bound.
		if len(args) == 1 && args[0].Type().Kind() == types.IntKind {
			return &cost.CallEstimate{CostEstimate: cost.Estimate{Min: 1, Max: 1}, ResultSize: &cost.SizeEstimate{Min: 1, Max: 20}}
		}
	case "quote":
		return &cost.CallEstimate{CostEstimate: cost.Estimate{Min: 1, Max: 1 + 48}, ResultSize: &cost.SizeEstimate{Min: 2, Max: 4*48 + 5}}
	case "words":
		if len(args) != 1 {
			return nil
		}
		in := args[0].ComputedSize()
		if in == nil {
			in = s.EstimateSize(args[0])
		}
		if in == nil {
			return nil
		}
		// Lower-casing may lengthen a character by half (U+023A, 2 bytes, to U+2C65, 3).
		word := &cost.SizeEstimate{Min: 1, Max: in.Max*3/2 + 1}
		return &cost.CallEstimate{CostEstimate: cost.Estimate{Min: 1, Max: 1 + in.Max*3/2}, ResultSize: &cost.SizeEstimate{Min: 0, Max: in.Max/2 + 1, Elem: word}}
	}
	return nil
}

// EstimateCallCost sizes the results of the string functions of cel-go's strings
// extension that make a word list from an argument (lowerAscii, upperAscii, trim, split),
// which CEL leaves unsized: without it, no expression that searches by words could be
// bounded.
func (s *sizes) EstimateCallCost(function, _ string, target *cost.AstNode, args []cost.AstNode) *cost.CallEstimate {
	if target == nil {
		return s.textCallCost(function, args)
	}
	in := (*target).ComputedSize()
	if in == nil {
		in = s.EstimateSize(*target)
	}
	if in == nil || (*target).Type().Kind() != types.StringKind {
		return nil
	}
	work := cost.Estimate{Min: 1, Max: 1 + in.Max}
	switch function {
	case "lowerAscii", "upperAscii", "trim":
		return &cost.CallEstimate{CostEstimate: work, ResultSize: &cost.SizeEstimate{Min: 0, Max: in.Max}}
	case "split":
		return &cost.CallEstimate{CostEstimate: work, ResultSize: &cost.SizeEstimate{Min: 0, Max: in.Max + 1}}
	}
	return nil
}

// observation compiles a mapping of keys to expressions, kept in file order.
func (c *compiler) observation(env *cel.Env, n *yaml.Node, field string) []obsField {
	var out []obsField
	for _, m := range c.d.mapping(n, field) {
		f := sub(field, m.key)
		if m.key == "" || len(m.key) > 64 || !isPrintableASCII(m.key) {
			c.d.errAt(at(m.k, f), "keys are 1 to 64 printable ASCII characters")
			continue
		}
		switch m.key {
		case "ok", "error", "status", "rule", "reason", "suggestion", "retry_after_ms", "truncated", "body",
			"world", "digest", "deadline_ms", "max_steps", "tools":
			c.d.errAt(at(m.k, f), "key %q is gauntlet's own (it marks failures); choose another", m.key)
			continue
		}
		if rv := resolve(m.v); rv != nil && rv.Kind == yaml.MappingNode {
			out = append(out, c.eachField(env, m.key, m.v, f))
			continue
		}
		out = append(out, obsField{key: m.key, val: c.compile(env, m.v, f, nil)})
	}
	return out
}

// eachField reads an answer's list of objects: {each: a list, as: a name, fields: the
// keys of each object, in the order written, over the element bound to the name}.
// CEL's maps have no order (an answer writes a map's keys sorted); this form is how a
// world answers with objects whose keys come in an order of its own.
func (c *compiler) eachField(env *cel.Env, key string, n *yaml.Node, f string) obsField {
	d := c.d
	o := obsField{key: key}
	var fieldsNode *yaml.Node
	for _, m := range d.mapping(n, f, "each", "as", "fields") {
		mf := sub(f, m.key)
		switch m.key {
		case "each":
			o.each = c.compile(env, m.v, mf, nil)
			if o.each != nil && o.each.ast.OutputType().Kind() != types.ListKind {
				d.errAt(at(m.v, mf), "%q has type %s, want a list", clip(o.each.src), o.each.ast.OutputType())
				o.each = nil
			}
		case "as":
			if s, ok := d.name(m.v, mf, false); ok {
				if _, taken := c.w.slots[s]; taken || slices.Contains([]string{"args", "new_id", "now_ms", "step", "i", "id", "self"}, s) {
					d.errAt(at(m.v, mf), "%q is already a name of the world", s)
				} else {
					o.as = s
				}
			}
		case "fields":
			fieldsNode = m.v
		}
	}
	for _, k := range []string{"each", "as", "fields"} {
		if !hasKey(n, k) {
			d.errAt(at(n, sub(f, k)), "required")
		}
	}
	if o.each == nil || o.as == "" || fieldsNode == nil {
		return o
	}
	elem := o.each.ast.OutputType().Parameters()[0]
	inner, err := env.Extend(cel.Variable(o.as, elem))
	if err != nil {
		d.errAt(at(n, f), "declare %s: %v", o.as, err)
		return o
	}
	for _, m := range d.mapping(fieldsNode, sub(f, "fields")) {
		ff := sub(sub(f, "fields"), m.key)
		if m.key == "" || len(m.key) > 64 || !isPrintableASCII(m.key) {
			d.errAt(at(m.k, ff), "keys are 1 to 64 printable ASCII characters")
			continue
		}
		o.fields = append(o.fields, obsField{key: m.key, val: c.compile(inner, m.v, ff, nil)})
	}
	if len(o.fields) == 0 {
		d.errAt(at(fieldsNode, sub(f, "fields")), "at least one key")
	}
	return o
}

var reachKeys = []string{"milestone", "when", "read"}

// reachOf reads one milestone a tool's call reaches: the milestone's name (a progress
// entry of the mapping form), the condition over the state after the call (and its
// arguments and new_id), and whether the call only reads.
func (c *compiler) reachOf(env *cel.Env, n *yaml.Node, f string) reachDef {
	d, w := c.d, c.w
	r := reachDef{}
	for _, m := range d.mapping(n, f, reachKeys...) {
		mf := sub(f, m.key)
		switch m.key {
		case "milestone":
			if s, ok := d.text(m.v, mf); ok {
				i := slices.Index(w.milestones, s)
				if s == "" || i < 0 {
					d.errAt(at(m.v, mf), "unknown milestone %q (declare it in progress as {milestone: %s})", clip(s), clip(s))
				} else {
					r.level = i + 1
				}
			}
		case "when":
			r.when = c.compile(env, m.v, mf, cel.BoolType)
		case "read":
			r.read, _ = d.boolean(m.v, mf)
		}
	}
	if rn := resolve(n); rn != nil && rn.Kind == yaml.MappingNode && !hasKey(n, "milestone") {
		d.errAt(at(n, sub(f, "milestone")), "required")
	}
	return r
}

func isPrintableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e || s[i] == '"' || s[i] == '\\' {
			return false
		}
	}
	return true
}

var toolKeys = []string{"name", "service", "description", "args", "preconditions", "safety", "effects", "observation", "spend", "advance_ms", "reach"}

func (c *compiler) tools(n *yaml.Node) {
	d, w := c.d, c.w
	nodes := d.sequence(n, "tools")
	if len(nodes) == 0 && isEmptyList(n) {
		d.errAt(at(n, "tools"), "at least one tool")
	}
	// Names first: the oracle and messages refer to tools by name.
	for i, tn := range nodes {
		f := idx("tools", i)
		t := toolDef{svc: -1, at: at(tn, f)}
		if nn := valueOf(tn, "name"); nn != nil {
			if s, ok := d.name(nn, sub(f, "name"), true); ok {
				if slices.Contains(w.toolNames, s) {
					d.errAt(at(nn, sub(f, "name")), "duplicate tool %q", s)
				}
				t.name = s
			}
		}
		if t.name == "" {
			if resolve(tn) != nil && resolve(tn).Kind == yaml.MappingNode && !hasKey(tn, "name") {
				d.errAt(at(tn, sub(f, "name")), "required")
			}
		}
		w.toolNames = append(w.toolNames, t.name)
		t.index = len(w.tools)
		w.tools = append(w.tools, t)
	}
	for i, tn := range nodes {
		c.tool(&w.tools[i], tn, idx("tools", i))
	}
}

// isEmptyList reports whether n is a list without items (other kinds are reported as
// such where they are read).
func isEmptyList(n *yaml.Node) bool {
	n = resolve(n)
	return n != nil && n.Kind == yaml.SequenceNode && len(n.Content) == 0
}

// valueOf returns the value of key in mapping n, without reporting anything.
func valueOf(n *yaml.Node, key string) *yaml.Node {
	n = resolve(n)
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return resolve(n.Content[i+1])
		}
	}
	return nil
}

func hasKey(n *yaml.Node, key string) bool {
	n = resolve(n)
	if n == nil || n.Kind != yaml.MappingNode {
		return false
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return true
		}
	}
	return false
}

func (c *compiler) tool(t *toolDef, tn *yaml.Node, f string) {
	d, w := c.d, c.w
	members := d.mapping(tn, f, toolKeys...)
	// Arguments first: every expression of the tool may read them.
	t.args = argSchema{typeName: "world.args." + t.name}
	for _, m := range members {
		if m.key == "args" {
			t.args = c.schema(m.v, sub(f, "args"), t.args.typeName)
		}
	}
	if t.args.schema == nil { // a tool without arguments takes the empty object
		t.args.schema, t.args.usage = t.args.render()
	}
	t.args.call = t.name + " " + t.args.usage
	names, ftypes := t.args.celFields()
	t.args.otype = c.prov.declare(t.args.typeName, names, ftypes)
	c.args = &t.args
	defer func() { c.args = nil }()
	env, err := c.base.Extend(cel.Variable("args", cel.ObjectType(t.args.typeName)))
	if err != nil {
		d.errAt(at(tn, f), "declare args: %v", err)
		return
	}
	postEnv, err := env.Extend(cel.Variable("new_id", cel.StringType))
	if err != nil {
		d.errAt(at(tn, f), "declare new_id: %v", err)
		return
	}
	for _, m := range members {
		mf := sub(f, m.key)
		switch m.key {
		case "service":
			if s, ok := d.text(m.v, mf); ok {
				t.service = s
				if t.svc = slices.Index(w.services, s); t.svc < 0 {
					d.errAt(at(m.v, mf), "unknown service %q (declared: %s)", clip(s), strings.Join(w.services, ", "))
				}
			}
		case "description":
			t.desc, _ = d.text(m.v, mf)
		case "preconditions":
			for i, pn := range d.sequence(m.v, mf) {
				t.pre = append(t.pre, c.precondition(env, pn, idx(mf, i)))
			}
		case "safety":
			for i, sn := range d.sequence(m.v, mf) {
				t.safety = append(t.safety, c.safetyRule(env, sn, idx(mf, i)))
			}
		case "effects":
			for i, en := range d.sequence(m.v, mf) {
				t.effects = append(t.effects, c.effect(env, en, idx(mf, i)))
			}
		case "observation":
			t.obs = c.observation(postEnv, m.v, mf)
		case "spend":
			t.spend = c.compile(env, m.v, mf, cel.IntType)
		case "advance_ms":
			t.advance = c.compile(env, m.v, mf, cel.IntType)
		case "reach":
			for i, rn := range d.sequence(m.v, mf) {
				t.reach = append(t.reach, c.reachOf(postEnv, rn, idx(mf, i)))
			}
		}
	}
	if t.desc == "" && !hasKey(tn, "description") && resolve(tn) != nil && resolve(tn).Kind == yaml.MappingNode {
		d.errAt(at(tn, sub(f, "description")), "required: what the tool does, as agents read it")
	}
}

var preKeys = []string{"rule", "require", "error", "reason", "suggestion"}

func (c *compiler) precondition(env *cel.Env, n *yaml.Node, f string) precondition {
	d := c.d
	p := precondition{at: at(n, f)}
	seen := map[string]bool{}
	for _, m := range d.mapping(n, f, preKeys...) {
		seen[m.key] = true
		mf := sub(f, m.key)
		switch m.key {
		case "rule":
			p.rule, _ = d.name(m.v, mf, false)
		case "require":
			p.require = c.compile(env, m.v, mf, cel.BoolType)
		case "error":
			p.err, _ = d.text(m.v, mf)
			p.errT = c.template(env, m.v, mf)
		case "reason":
			p.reason = c.template(env, m.v, mf)
		case "suggestion":
			p.suggestion = c.template(env, m.v, mf)
		}
	}
	if resolve(n) == nil || resolve(n).Kind != yaml.MappingNode {
		return p
	}
	for _, k := range []string{"require", "error"} {
		if !seen[k] {
			d.errAt(at(n, sub(f, k)), "required")
		}
	}
	if seen["rule"] && (!seen["reason"] || !seen["suggestion"]) {
		d.errAt(at(n, f), "a rule (an edge of the causal graph) needs a reason and a suggestion")
	}
	return p
}

var safetyKeys = []string{"event", "when", "reason"}

// safetyRule reads one of a tool's safety rules: all three keys are required, the
// event a name (it starts the recorded safety event, which SQL groups by).
func (c *compiler) safetyRule(env *cel.Env, n *yaml.Node, f string) safetyRule {
	d := c.d
	r := safetyRule{at: at(n, f)}
	seen := map[string]bool{}
	for _, m := range d.mapping(n, f, safetyKeys...) {
		seen[m.key] = true
		mf := sub(f, m.key)
		switch m.key {
		case "event":
			r.event, _ = d.name(m.v, mf, false)
		case "when":
			r.when = c.compile(env, m.v, mf, cel.BoolType)
		case "reason":
			r.reason = c.template(env, m.v, mf)
		}
	}
	if resolve(n) == nil || resolve(n).Kind != yaml.MappingNode {
		return r
	}
	for _, k := range safetyKeys {
		if !seen[k] {
			d.errAt(at(n, sub(f, k)), "required")
		}
	}
	return r
}

var effectKeys = []string{"set", "key", "to", "add", "fields"}

func (c *compiler) effect(env *cel.Env, n *yaml.Node, f string) effect {
	d, w := c.d, c.w
	e := effect{setVar: -1, entity: -1, field: -1, at: at(n, f)}
	ms := d.mapping(n, f, effectKeys...)
	get := func(k string) *yaml.Node {
		for _, m := range ms {
			if m.key == k {
				return m.v
			}
		}
		return nil
	}
	if ms == nil {
		return e
	}
	set, add := get("set"), get("add")
	switch {
	case (set == nil) == (add == nil):
		d.errAt(at(n, f), "want exactly one of set (a variable or entity.field) and add (an entity)")
	case set != nil:
		target, ok := d.text(set, sub(f, "set"))
		if !ok {
			return e
		}
		var k kind
		if ent, fld, isField := strings.Cut(target, "."); isField {
			e.entity = slices.IndexFunc(w.entities, func(x entityDef) bool { return x.name == ent })
			if e.entity < 0 {
				d.errAt(at(set, sub(f, "set")), "unknown entity %q", clip(ent))
				return e
			}
			ed := &w.entities[e.entity]
			e.field = slices.IndexFunc(ed.fields, func(x varDef) bool { return x.name == fld })
			if e.field < 0 {
				d.errAt(at(set, sub(f, "set")), "entity %s has no field %q", ent, clip(fld))
				return e
			}
			k = ed.fields[e.field].draw.kind
			if kn := get("key"); kn == nil {
				d.errAt(at(n, sub(f, "key")), "required: the id of the %s to change", ent)
			} else {
				e.key = c.compile(env, kn, sub(f, "key"), cel.StringType)
			}
		} else {
			e.setVar = slices.IndexFunc(w.vars, func(x varDef) bool { return x.name == target })
			if e.setVar < 0 {
				d.errAt(at(set, sub(f, "set")), "unknown variable %q (an entity field is entity.field)", clip(target))
				return e
			}
			k = w.vars[e.setVar].draw.kind
			if w.vars[e.setVar].draw.param > 0 {
				d.errAt(at(set, sub(f, "set")), "%s is a param: the episode's request sets it, no tool", target)
			}
			if k == kInts {
				d.errAt(at(set, sub(f, "set")), "%s is a list(int): drawn, never set", target)
			}
			if get("key") != nil {
				d.errAt(at(get("key"), sub(f, "key")), "a variable has no key")
			}
		}
		if get("fields") != nil {
			d.errAt(at(get("fields"), sub(f, "fields")), "fields belong to add")
		}
		if tn := get("to"); tn == nil {
			d.errAt(at(n, sub(f, "to")), "required: the new value")
		} else {
			e.to = c.compile(env, tn, sub(f, "to"), k.cel())
		}
	default:
		e.add = true
		ent, ok := d.text(add, sub(f, "add"))
		if !ok {
			return e
		}
		e.entity = slices.IndexFunc(w.entities, func(x entityDef) bool { return x.name == ent })
		if e.entity < 0 {
			d.errAt(at(add, sub(f, "add")), "unknown entity %q", clip(ent))
			return e
		}
		for _, k := range []string{"key", "to"} {
			if get(k) != nil {
				d.errAt(at(get(k), sub(f, k)), "%s belongs to set", k)
			}
		}
		ed := &w.entities[e.entity]
		if ed.key >= 0 {
			d.errAt(at(add, sub(f, "add")), "%s takes its ids from its key field when drawn; a tool cannot add one", ent)
		}
		e.addFields = make([]*program, len(ed.fields))
		for _, m := range d.mapping(get("fields"), sub(f, "fields")) {
			j := slices.IndexFunc(ed.fields, func(x varDef) bool { return x.name == m.key })
			if j < 0 {
				d.errAt(at(m.k, sub(sub(f, "fields"), m.key)), "entity %s has no field %q", ent, clip(m.key))
				continue
			}
			e.addFields[j] = c.compile(env, m.v, sub(sub(f, "fields"), m.key), ed.fields[j].draw.kind.cel())
		}
	}
	return e
}

var oracleKeys = []string{"wait", "steps"}
var stepKeys = []string{"name", "call", "args", "when", "recover", "done_if_rule"}

func (c *compiler) oraclePlan(n *yaml.Node) {
	d, w := c.d, c.w
	// The plan reads only what agents see: the first observation and the answers.
	c.plan = true
	defer func() { c.plan = false }()
	env, err := cel.NewEnv(cel.CustomTypeProvider(c.prov), ext.Strings(), ext.Lists(), ext.Math(), ext.Bindings(), ext.TwoVarComprehensions(),
		cel.Variable("task", cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable("results", cel.MapType(cel.StringType, cel.MapType(cel.StringType, cel.DynType))))
	if err != nil {
		d.errAt(at(n, "oracle"), "declare task and results: %v", err)
		return
	}
	p := &oraclePlan{adapter: env.CELTypeAdapter(), env: env}
	seen := map[string]bool{}
	for _, m := range d.mapping(n, "oracle", oracleKeys...) {
		seen[m.key] = true
		switch m.key {
		case "wait":
			for _, wm := range d.mapping(m.v, "oracle.wait", "tool", "arg") {
				switch wm.key {
				case "tool":
					if s, ok := d.text(wm.v, "oracle.wait.tool"); ok {
						if p.waitTool = c.lookupTool(s); p.waitTool == nil {
							d.errAt(at(wm.v, "oracle.wait.tool"), "unknown tool %q", clip(s))
						}
					}
				case "arg":
					p.waitArg, _ = d.text(wm.v, "oracle.wait.arg")
				}
			}
			if p.waitTool != nil {
				if a := p.waitTool.args.prop(p.waitArg); a == nil || a.kind != kInt {
					d.errAt(at(m.v, "oracle.wait.arg"), "want the integer argument (milliseconds) of tool %s", p.waitTool.name)
				}
			}
		case "steps":
			for i, sn := range d.sequence(m.v, "oracle.steps") {
				f := idx("oracle.steps", i)
				s := oracleStep{}
				var callNode, argsNode *yaml.Node
				for _, sm := range d.mapping(sn, f, stepKeys...) {
					sf := sub(f, sm.key)
					switch sm.key {
					case "name":
						if s.name, _ = d.name(sm.v, sf, false); seen["step:"+s.name] {
							d.errAt(at(sm.v, sf), "duplicate step name %q", s.name)
						}
						seen["step:"+s.name] = true
					case "when":
						s.when = c.compile(env, sm.v, sf, cel.BoolType)
					case "done_if_rule":
						for j, r := range d.sequence(sm.v, sf) {
							if v, ok := d.name(r, idx(sf, j), false); ok {
								s.doneIfRules = append(s.doneIfRules, v)
							}
						}
					case "call":
						callNode = sm.v
					case "args":
						argsNode = sm.v
					case "recover":
						var rcall, rargs *yaml.Node
						for _, rm := range d.mapping(sm.v, sf, "call", "args") {
							if rm.key == "call" {
								rcall = rm.v
							} else {
								rargs = rm.v
							}
						}
						rc := c.oracleCall(env, sm.v, rcall, rargs, sf)
						s.recover = &rc
					}
				}
				s.call = c.oracleCall(env, sn, callNode, argsNode, f)
				if s.name == "" && !hasKey(sn, "name") {
					d.errAt(at(sn, sub(f, "name")), "required: results.<name> holds the step's answer")
				}
				p.steps = append(p.steps, s)
			}
		}
	}
	cl := newPlanClosures(w, c.prov, env)
	for i := range p.steps {
		s := &p.steps[i]
		boundPlan(env, cl, s.when)
		for _, calls := range []*oracleCall{&s.call, s.recover} {
			if calls != nil {
				for _, f := range calls.args {
					boundPlan(env, cl, f.val)
				}
			}
		}
	}
	if !seen["steps"] {
		d.errAt(at(n, "oracle.steps"), "required: the plan's steps")
	}
	if !seen["wait"] {
		d.errAt(at(n, "oracle.wait"), "required: the tool (and its milliseconds argument) the oracle waits with when a service asks it to retry later")
	}
	w.oracle = p
}

// oracleCall reads a step's (or a recover's) call and args; n is the mapping holding them.
func (c *compiler) oracleCall(env *cel.Env, n, callNode, argsNode *yaml.Node, f string) oracleCall {
	d := c.d
	var oc oracleCall
	if callNode != nil {
		if s, ok := d.text(callNode, sub(f, "call")); ok {
			if oc.tool = c.lookupTool(s); oc.tool == nil {
				d.errAt(at(callNode, sub(f, "call")), "unknown tool %q", clip(s))
			}
		}
	}
	if oc.tool == nil {
		if callNode == nil && resolve(n) != nil && resolve(n).Kind == yaml.MappingNode {
			d.errAt(at(n, sub(f, "call")), "required: the tool to call")
		}
		return oc
	}
	given := map[string]bool{}
	for _, m := range d.mapping(argsNode, sub(f, "args")) {
		af := sub(sub(f, "args"), m.key)
		pr := oc.tool.args.prop(m.key)
		if pr == nil {
			d.errAt(at(m.k, af), "tool %s has no argument %q", oc.tool.name, clip(m.key))
			continue
		}
		given[m.key] = true
		// The plan reads dyn values (observations), so the type is checked when it runs.
		oc.args = append(oc.args, obsField{key: m.key, val: c.compile(env, m.v, af, nil)})
	}
	for _, r := range oc.tool.args.required {
		if !given[r] {
			d.errAt(at(n, sub(f, "args")), "tool %s needs argument %q", oc.tool.name, r)
		}
	}
	// In the order of the action's canonical JSON, once (the keys are distinct).
	slices.SortFunc(oc.args, func(x, y obsField) int { return cmpString(x.key, y.key) })
	return oc
}

func (c *compiler) lookupTool(name string) *toolDef {
	for i := range c.w.tools {
		if c.w.tools[i].name == name {
			return &c.w.tools[i]
		}
	}
	return nil
}

// trialResets builds the worlds of a few seeds, so that an expression that type-checks
// but fails on real values (a draw reading a value drawn after it, an empty range, a
// division by zero) is a load error, not an infra error in the middle of a run.
func (c *compiler) trialResets() {
	for seed := uint64(1); seed <= 3; seed++ {
		ep := &episode{w: c.w, maxSteps: c.w.maxSteps, deadlineMs: c.w.deadlineMs, maxInvalid: c.w.maxInvalid}
		if _, err := ep.reset(seed); err != nil {
			var ee *evalError
			if errors.As(err, &ee) {
				c.d.errAt(ee.at, "seed %d: %v", seed, ee.err)
			} else {
				c.d.errAt(place{line: 1, col: 1}, "seed %d: %v", seed, err)
			}
			return
		}
	}
}
