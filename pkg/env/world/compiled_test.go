package world

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
)

// closureCheck compares the compiled closures of one world with CEL's interpreter.
type closureCheck struct {
	t testing.TB
	// decided counts, per expression, the evaluations a closure answered (the others it
	// left to the interpreter); checked counts the comparisons made.
	decided map[*program]int
	checked int
	bad     int
}

// same fails the test when CEL's interpreter does not give what closure gave.
func (c *closureCheck) same(p *program, a *activation, got ref.Val) {
	c.checked++
	prg := p.fast
	if prg == nil {
		prg = p.prg // sized: the cost the closure ran without is under the limit
	}
	want, _, err := prg.Eval(a)
	var gb, wb []byte
	if err == nil {
		gb, _ = appendVal(nil, got)
		wb, _ = appendVal(nil, want)
	}
	if err != nil || got.Type() != want.Type() || types.Equal(got, want) != types.True || !bytes.Equal(gb, wb) {
		c.bad++
		if c.bad <= 10 {
			c.t.Errorf("line %d %s: %q: closure gives %v (%s), CEL %v (%v)", p.at.line, p.at.field, p.src, got, gb, want, err)
		}
	}
}

// all evaluates every expression of the world that runs compiled on the episode's
// current state, with arguments drawn for its tool, both ways.
func (c *closureCheck) all(ep *episode, r *rand.Rand) {
	for _, b := range ep.w.bounded {
		if b.p.run == nil {
			continue
		}
		a := ep.scope(nil)
		if b.args != nil {
			a.args = randomArgs(ep, b.args, r)
		}
		if r.IntN(2) == 0 {
			a.newID = randomID(ep, r)
		}
		if b.p.fast == nil && !b.p.sized.under(a) {
			continue
		}
		if v := b.p.run(a); !types.IsError(v) {
			c.decided[b.p]++
			c.same(b.p, a, v)
		}
	}
}

// randomID is an id of the state (or not quite one).
func randomID(ep *episode, r *rand.Rand) ref.Val {
	for range 3 {
		if len(ep.ents) == 0 {
			break
		}
		col := &ep.ents[r.IntN(len(ep.ents))]
		if len(col.ids) > 0 {
			return types.String(col.ids[r.IntN(len(col.ids))])
		}
	}
	return types.String([]string{"", "x-1", "sku-", "0"}[r.IntN(4)])
}

// randomArgs draws a tool's arguments: ids of the state, words of its strings, edges of
// the declared ranges, some left out.
func randomArgs(ep *episode, s *argSchema, r *rand.Rand) *object {
	o := newObject(s.otype)
	for i, p := range s.props {
		if !p.required && r.IntN(5) == 0 {
			continue
		}
		switch p.kind {
		case kInt:
			vals := []int64{p.min, p.max, 0, 1, 2, 3, -1, 500, 1 << 40}
			o.vals[i] = types.Int(vals[r.IntN(len(vals))])
			if r.IntN(2) == 0 && p.max > p.min {
				o.vals[i] = types.Int(p.min + r.Int64N(min(p.max-p.min, 1<<30)+1))
			}
		case kBool:
			o.vals[i] = types.Bool(r.IntN(2) == 0)
		default:
			switch k := r.IntN(4); {
			case len(p.enum) > 0 && k == 0:
				o.vals[i] = types.String(p.enum[r.IntN(len(p.enum))])
			case k <= 1:
				o.vals[i] = randomID(ep, r)
			case k == 2:
				o.vals[i] = randomWord(ep, r)
			default:
				o.vals[i] = types.String([]string{"", " ", "MUG red", "a b c"}[r.IntN(4)])
			}
		}
	}
	return o
}

// randomWord is a string of the state, or a word of one.
func randomWord(ep *episode, r *rand.Rand) ref.Val {
	var words []string
	for _, v := range ep.vars {
		if s, ok := v.(types.String); ok {
			words = append(words, string(s))
		}
	}
	for k := range ep.ents {
		for _, row := range ep.ents[k].objs {
			for _, v := range row.vals {
				if s, ok := v.(types.String); ok {
					words = append(words, string(s))
				}
			}
		}
	}
	if len(words) == 0 {
		return types.String("")
	}
	slices.Sort(words)
	w := words[r.IntN(len(words))]
	if f := bytes.Fields([]byte(w)); len(f) > 1 && r.IntN(2) == 0 {
		return types.String(f[r.IntN(len(f))])
	}
	return types.String(w)
}

// withCheck makes every evaluation a closure answers be compared with the interpreter's
// while f runs.
func withCheck(t testing.TB, f func(c *closureCheck)) {
	c := &closureCheck{t: t, decided: map[*program]int{}}
	checkClosures = func(p *program, a *activation, v ref.Val) {
		c.decided[p]++
		c.same(p, a, v)
	}
	defer func() { checkClosures = nil }()
	f(c)
}

// builtinWorlds are the worlds whose every expression the closures are checked on, with
// a stress plan for each.
func builtinWorlds(t testing.TB) []struct {
	e      env.Env
	config func(seed uint64) env.Config
} {
	return []struct {
		e      env.Env
		config func(seed uint64) env.Config
	}{
		{bank(t), func(seed uint64) env.Config { return env.Config{Seed: seed, Faults: stressPlan(t, seed)} }},
		{airline(t), func(seed uint64) env.Config { return airlineStress(t, seed) }},
		{shopPort(t), func(seed uint64) env.Config { return shopStress(t, seed) }},
		{dispatch(t), func(seed uint64) env.Config { return dispatchStress(t, seed) }},
	}
}

func shopStress(t testing.TB, seed uint64) env.Config {
	return env.Config{Seed: seed, Faults: injector(t, rng.Derive(seed, "plan"),
		httpErr("pay-503", "payment", 0.3, 503, 250), httpErr("any-429", "*", 0.05, 429, 500),
		latency("lat", "*", 0.5, 40, 20),
		truncate("cat-trunc", "catalog", 0.1, 0.5), truncate("pay-trunc", "payment.pay", 0.1, 0.2))}
}

// TestClosuresAgreeWithCEL: every expression of every built-in world (and the shop's
// port) that runs compiled gives what CEL's interpreter gives, on the states random and
// oracle episodes reach under faults, with arguments of every kind; and on those
// states, every such expression is answered by its closure at least once.
func TestClosuresAgreeWithCEL(t *testing.T) {
	seeds := uint64(60)
	if testing.Short() {
		seeds = 30
	}
	random, err := policy.Lookup("random")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range builtinWorlds(t) {
		withCheck(t, func(c *closureCheck) {
			var world *World
			for seed := uint64(1); seed <= seeds; seed++ {
				var agent env.Agent = w.e.(env.Oracle).Oracle(seed)
				if seed%2 == 0 {
					if agent, err = random.NewAgent(w.e, seed); err != nil {
						t.Fatal(err)
					}
				}
				r := rand.New(rand.NewPCG(seed, 7))
				playChecked(t, c, w.e, agent, w.config(seed), r)
				world = worldOf(w.e)
			}
			compiled, total := 0, len(world.bounded)
			for _, b := range world.bounded {
				if b.p.run == nil {
					t.Logf("%s: line %d %s runs on the interpreter: %q", world.name, b.p.at.line, b.p.at.field, b.p.src)
					continue
				}
				compiled++
				if c.decided[b.p] == 0 {
					t.Errorf("%s: line %d %s: %q: its closure never answered", world.name, b.p.at.line, b.p.at.field, b.p.src)
				}
			}
			t.Logf("%s: %d of %d untracked expressions compiled, %d evaluations compared", world.name, compiled, total, c.checked)
			if compiled == 0 || c.checked == 0 {
				t.Errorf("%s: nothing compared", world.name)
			}
		})
	}
}

func worldOf(e env.Env) *World {
	w, _ := Of(e)
	return w
}

// playChecked plays one episode with checks on, and after each step evaluates every
// compiled expression on the state reached, both ways.
func playChecked(t testing.TB, c *closureCheck, e env.Env, agent env.Agent, cfg env.Config, r *rand.Rand) {
	ep, err := e.NewEpisode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	obs, err := ep.Reset()
	if err != nil {
		t.Fatal(err)
	}
	we := ep.(*episode)
	c.all(we, r)
	for i := uint32(0); ; i++ {
		a, err := agent.Act(env.Turn{Step: i, Observation: obs})
		if err != nil {
			t.Fatalf("seed %d step %d: %v", cfg.Seed, i, err)
		}
		res, err := ep.Step(a)
		if err != nil {
			t.Fatalf("seed %d step %d: %v", cfg.Seed, i, err)
		}
		c.all(we, r)
		obs = res.Observation
		if res.Done() {
			return
		}
	}
}

// FuzzClosuresAgainstCEL plays a world with actions the input picks (each a tool and
// arguments drawn from the state) and compares every compiled expression with CEL's
// interpreter after each step.
func FuzzClosuresAgainstCEL(f *testing.F) {
	f.Add(uint8(0), uint64(1), []byte{0, 1, 2, 3, 4, 5, 6, 7})
	f.Add(uint8(1), uint64(2), []byte{9, 9, 9, 1, 200, 3})
	f.Add(uint8(2), uint64(3), []byte{0, 3, 1, 2, 4, 5, 6, 7, 0, 0})
	f.Add(uint8(3), uint64(4), []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Fuzz(func(t *testing.T, which uint8, seed uint64, moves []byte) {
		ws := builtinWorlds(t)
		w := ws[int(which)%len(ws)]
		if len(moves) > 40 {
			moves = moves[:40]
		}
		withCheck(t, func(c *closureCheck) {
			cfg := w.config(seed)
			ep, err := w.e.NewEpisode(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ep.Reset(); err != nil {
				t.Fatal(err)
			}
			we := ep.(*episode)
			r := rand.New(rand.NewPCG(seed, uint64(len(moves))))
			type action struct {
				name string
				tool *toolDef
			}
			var actions []action
			for _, role := range we.w.roles {
				for _, t := range role.tools {
					actions = append(actions, action{role.name + ":" + t.name, t})
				}
			}
			if len(actions) == 0 {
				for i := range we.w.tools {
					actions = append(actions, action{we.w.tools[i].name, &we.w.tools[i]})
				}
			}
			for _, m := range moves {
				act := actions[int(m)%len(actions)]
				tool := act.tool
				args := randomArgs(we, &tool.args, r)
				raw, err := args.ConvertToNative(reflect.TypeFor[map[string]any]())
				if err != nil {
					t.Fatal(err)
				}
				js, err := json.Marshal(raw)
				if err != nil {
					t.Fatal(err)
				}
				res, err := ep.Step(env.Action{Tool: act.name, Args: js})
				if err != nil {
					t.Fatalf("step %s: %v", tool.name, err)
				}
				c.all(we, r)
				if res.Done() {
					break
				}
			}
			if c.bad > 0 {
				t.Fatalf("%d of %d comparisons differ", c.bad, c.checked)
			}
		})
	})
}

// edges is a world whose one tool answers with expressions at the edges of CEL's
// semantics: errors absorbed by || and &&, overflow, division by zero, missing keys,
// indexes out of range, comprehensions that fail on some elements only.
const edges = `name: edges
services: [svc]
vars:
  big: {type: int, value: 9223372036854775807}
  zero: {type: int, value: 0}
  n: {type: int, uniform: [1, 5]}
  word: {type: string, choice: [a, b, abc]}
  flag: {type: bool, bernoulli: 0.5}
  perm: {type: list(int), shuffle: 4}
  evens: {type: list(int), expr: "[0, 2, 4]"}
entities:
  item:
    prefix: it-
    count: {uniform: [1, 3]}
    fields:
      v: {type: int, uniform: [0, 4]}
      s: {type: string, choice: [a, b, abc]}
tools:
  - name: probe
    service: svc
    description: answers with edge cases
    args:
      type: object
      properties:
        k: {type: string, maxLength: 8}
        m: {type: integer, minimum: -3, maximum: 3}
      required: [k]
    observation:
      overflow: big + 1
      div_zero: n / zero
      mod_zero: n % zero
      or_true_after_error: big + 1 > 0 || zero == 0
      or_true_before_error: zero == 0 || big + 1 > 0
      or_false_and_error: zero == 1 || big + 1 > 0
      and_false_after_error: big + 1 > 0 && zero == 1
      and_true_and_error: zero == 0 && big + 1 > 0
      out_of_range: "[1, 2, 3][n + 2]"
      negative_index: "[1, 2, 3][args.m]"
      index_int: "[10, 20, 30][args.m] + n"
      index_string: "['x', 'y'][args.m] + word"
      index_shuffled: "perm[args.m] * 2 + perm[n - 1]"
      index_shuffled_out_of_range: "perm[n + 3] + 1"
      index_computed: "evens[args.m] + evens[0]"
      missing_key: "{'a': 1}[args.k]"
      record_field: "{'a': n, 'b': zero}.b"
      record_in: "args.k in {'a': 1, 'abc': 2}"
      exists_past_error: "[1, 2, 3].exists(x, x == 2 || x / zero > 0)"
      exists_error: "[1, 2, 3].exists(x, x / zero > 0)"
      all_error: "[1, 2, 3].all(x, x / (x - 2) > 0)"
      map_overflow: "[1, 2].map(x, x * big)"
      filter_error: "[1, 2, 0].filter(x, n / x > 1)"
      filter: "['a', 'b', 'abc'].filter(w, w != args.k)"
      transform: "['a', 'b'].transformList(i, w, w == args.k, {'i': i, 'w': w + word})"
      contains: "'abc'.contains(args.k)"
      conditional: "size(args.k) > 2 ? 'long' : 'short'"
      conditional_error: "n / zero > 1 ? 'a' : 'b'"
      in_list: "args.k in ['a', 'b']"
      bind: cel.bind(v, n + args.m, v * v)
      compare_mixed: args.m < n && word >= args.k
      absent_arg: args.m + 1
      concat_chain: "word + '-' + args.k + '-' + word + (flag ? 'y' : 'n')"
      negate: -(args.m + n)
      negate_overflow: -(zero - big - 1)
      bool_order: (n > 2) < (args.m > 0)
      bool_equal: (n > 2) == flag
      string_order: args.k < word || args.k >= 'ab'
      starts_ends: word.startsWith(args.k) && args.k.endsWith('c')
      in_collection: "args.k in item || (n > 2 ? 'it-1' : 'it-' + args.k) in item"
      entity_field: "item[size(args.k) > 1 ? 'it-1' : 'it-9'].v + n"
      entity_field_error: item[args.k].v / zero
      exists_entity: item.exists(k, x, x.v > n && x.s != args.k)
      all_entity_error: item.all(k, x, x.v / (x.v - 2) > 0)
      nested_quantifiers: item.exists(k, x, item.all(j, y, y.v <= x.v))
      exists_two_vars: item.exists(k, x, k == args.k || x.s == word)
      let_string: "cel.bind(w, args.k + word, size(w) > 2 ? w : 'short')"
      let_error: cel.bind(x, n / zero, true)
      let_nested: cel.bind(a, n, cel.bind(b, a * 2, a + b))
      memo_twice: args.k.upperAscii() + args.k.upperAscii()
      memo_shared: size(args.k.upperAscii().split('B'))
      conditional_unused_error: "n > 0 ? n : n / zero"
      not_error: "!(n / zero > 1) || flag || !flag"
      flag_compare: flag != (args.m == 1)
      char_at: word.charAt(args.m)
      char_at_concat: "'sku-' + args.k.charAt(args.m + 2) + word.charAt(0)"
      char_at_out_of_ascii_range: "('é' + args.k).charAt(args.m + 1)"
      char_at_literal: "'0123'.charAt(args.m + 1) + 'abc'.charAt(n - 2)"
      char_at_literal_end: "'ab'.charAt(args.m + 2) + '-'"
      char_at_literal_out_of_range: "'ab'.charAt(args.m + 4)"
      char_at_literal_empty: "''.charAt(args.m + 3)"
      char_at_literal_not_ascii: "'aé'.charAt(args.m + 1) + 'x'"
      literal_operands: "n * 16 % 7 + (word + 'x' > 'b' ? 1 : 0) + (args.k == '' ? 2 : 3)"
      number_text: "'n=' + string(n + args.m) + (n == 1 ? ' unit' : ' units')"
      joined_across: "(word + ' ' + args.k).contains(word.charAt(0) + ' ' + args.k.charAt(0))"
      joined_nested: "(word + ((args.k + '-').startsWith(word) ? 'y' : 'n') + args.k).endsWith(string(args.m) + args.k)"
      joined_each: "item.exists(k, x, (x.s + k).contains(args.k + '-') || (k + x.s).endsWith(args.k))"
      joined_empty: "(args.k + '').startsWith('') && ('' + args.k).contains(args.k)"
success: n > 100
`

// TestClosuresOnEdges: on every edge, a closure gives what CEL gives or leaves the
// evaluation to it; where CEL fails, no closure answers.
func TestClosuresOnEdges(t *testing.T) {
	w, err := Load("edges.yaml", []byte(edges))
	if err != nil {
		t.Fatal(err)
	}
	ep, err := w.Env().NewEpisode(env.Config{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ep.Reset(); err != nil {
		t.Fatal(err)
	}
	we := ep.(*episode)
	c := &closureCheck{t: t, decided: map[*program]int{}}
	failed := 0
	tool := &w.tools[0]
	for seed := uint64(1); seed <= 50; seed++ {
		if _, err := ep.(*episode).reset(seed); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"a", "b", "abc", "zz", ""} {
			for m := int64(-3); m <= 3; m++ {
				args := newObject(tool.args.otype)
				args.vals[0] = types.String(k)
				if m != 3 {
					args.vals[1] = types.Int(m) // 3 stands for an absent m
				}
				for _, b := range w.bounded {
					a := we.scope(args)
					got := b.p.run(a)
					prg := b.p.fast
					if prg == nil {
						prg = b.p.prg
					}
					if _, _, err := prg.Eval(a); err != nil {
						failed++
						if !types.IsError(got) {
							t.Errorf("%s: k %q m %d: CEL fails (%v), the closure gives %v", b.p.at.field, k, m, err, got)
						}
						continue
					}
					if !types.IsError(got) {
						c.decided[b.p]++
						c.same(b.p, a, got)
					}
				}
			}
		}
	}
	for _, b := range w.bounded {
		if c.decided[b.p] == 0 && !strings.Contains(b.p.at.field, "error") && !strings.Contains(b.p.at.field, "zero") &&
			!strings.Contains(b.p.at.field, "overflow") && !strings.Contains(b.p.at.field, "range") {
			t.Errorf("%s: %q: its closure never answered", b.p.at.field, b.p.src)
		}
	}
	t.Logf("%d expressions, %d comparisons, %d evaluations CEL failed", len(w.bounded), c.checked, failed)
}

const settled = `
name: settled
services: [svc]
vars:
  n: {type: int, value: 0}
entities:
  item:
    prefix: it-
    count: {expr: "4"}
    fields:
      v: {type: int, expr: i}
tools:
  - name: bump
    service: svc
    description: raises n while some item is above it
    preconditions:
      - {require: "size(item.transformList(k, x, x.v > n, k)) > 1", error: "${size(item.transformList(k, x, x.v > n, k))} left"}
    effects:
      - {set: n, to: n + 1}
    observation:
      left: size(item.transformList(k, x, x.v > n, k))
      above:
        each: item.transformList(k, x, x.v > n, k)
        as: h
        fields: {id: h, rest: "size(item.transformList(k, x, x.v > item[h].v, k))"}
success: n > 100
`

// TestSettledMemo: what a step's answer computes over the state after its effects is
// remembered for that step only. The answer's total and list, written the same way, are
// one value; the precondition, read before the effect, sees the state before it; each
// step sees its own n; and an expression of a list's element is computed per element.
func TestSettledMemo(t *testing.T) {
	w, err := Load("settled.yaml", []byte(settled))
	if err != nil {
		t.Fatal(err)
	}
	// The filter and its size (the precondition's, the total's and the list's); not
	// rest, which reads the element h.
	var keys []string
	for k := range w.settledSlots {
		keys = append(keys, k[:min(len(k), 9)])
	}
	slices.Sort(keys)
	if !slices.Equal(keys, []string{"fold(k,x,", "size(fold"}) {
		t.Errorf("remembered after the effects: %v, want the filter and its size", w.settledSlots)
	}
	ep, err := w.Env().NewEpisode(env.Config{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ep.Reset(); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`{"ok":true,"left":2,"above":[{"id":"it-3","rest":1},{"id":"it-4","rest":0}]}`,
		`{"ok":true,"left":1,"above":[{"id":"it-4","rest":0}]}`,
		`{"ok":false,"error":"1 left"}`,
	}
	for i, w := range want {
		r, err := ep.Step(env.Action{Tool: "bump", Args: json.RawMessage(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		if got := string(r.Observation); got != w {
			t.Errorf("step %d: got %s, want %s", i+1, got, w)
		}
	}
	if we := ep.(*episode); len(we.settled) != 2 || we.settled[0] == nil || we.settled[1] == nil {
		t.Errorf("the second step's answer remembered %v, want the filter and its size", we.settled)
	}
}

const growing = `
name: growing
services: [svc]
vars:
  text: {type: string, value: "a"}
tools:
  - name: grow
    service: svc
    description: appends its words to the text and says whether one was there
    args:
      type: object
      properties:
        s: {type: string, maxLength: 100}
      required: [s]
    effects:
      - {set: text, to: text + ' ' + args.s}
    observation:
      found: "words(args.s).exists(w, text.contains(w))"
      all: "words(args.s).all(w, text.contains(w))"
success: size(text) > 60000
`

// TestSizedVerdictPerStep: an expression whose cost only the state's sizes bound runs
// without cost tracking after a step's effects only while those sizes keep it under
// the limit, the verdict remembered for that step alone. The text grows by 100 bytes a
// step until CEL's estimate of the answer's folds passes the limit (their actual cost
// stays small: the first word is always there): every untracked evaluation must be
// under the limit on the state it ran on, and the last steps must run tracked.
func TestSizedVerdictPerStep(t *testing.T) {
	w, err := Load("growing.yaml", []byte(growing))
	if err != nil {
		t.Fatal(err)
	}
	ep, err := w.Env().NewEpisode(env.Config{Seed: 1, MaxSteps: 200})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ep.Reset(); err != nil {
		t.Fatal(err)
	}
	untracked, steps := 0, 0
	checkClosures = func(p *program, a *activation, v ref.Val) {
		if p.sized == nil {
			return
		}
		untracked++
		if !p.sized.under(a) {
			t.Errorf("step %d: %s ran untracked on a state its cost estimate does not keep under the limit", steps, p.at.field)
		}
	}
	defer func() { checkClosures = nil }()
	words := strings.Repeat("a ", 49) + "b"
	args, err := json.Marshal(map[string]string{"s": words})
	if err != nil {
		t.Fatal(err)
	}
	lastUntracked := 0
	for steps = 1; steps <= 150; steps++ {
		before := untracked
		r, err := ep.Step(env.Action{Tool: "grow", Args: args})
		if err != nil {
			t.Fatalf("step %d: %v", steps, err)
		}
		if untracked > before {
			lastUntracked = steps
		}
		if r.Done() {
			break
		}
	}
	if lastUntracked == 0 || lastUntracked >= steps-1 {
		t.Errorf("the answer ran untracked up to step %d of %d: want the first steps untracked and the last tracked", lastUntracked, steps-1)
	}
	t.Logf("untracked up to step %d, %d evaluations", lastUntracked, untracked)
}
