package world

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"os"
	"slices"
	"strings"
	"testing"

	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
)

// TestOraclePlanActions pins the actions the plan oracles of the shop file, the bank
// and the airline choose over seeds, without faults and under the stress plans: the
// digests were taken before the oracle read its answers as CEL values once and kept a
// retried call's action, and they must not move when its speed work does.
func TestOraclePlanActions(t *testing.T) {
	seeds := uint64(300)
	if testing.Short() {
		seeds = 60
	}
	for _, c := range []struct {
		name   string
		e      env.Env
		stress func(testing.TB, uint64) env.Config
		want   map[uint64]string
	}{
		{"shop", shopPort(t), shopStress, map[uint64]string{
			60:  "6d8f806cda8c8b2b9e148e850ad95a826ee2505e40bee4a6d4b94f83bf93dc76",
			300: "8c93ff87d42227d651cfd73e427259629f9c002049a73785157ad83745e2bda7"}},
		{"bank", bank(t), func(t testing.TB, seed uint64) env.Config {
			return env.Config{Seed: seed, Faults: stressPlan(t, seed)}
		}, map[uint64]string{
			60:  "671ae27f1ac302915ef41fdccafd3d3ac275f379d62a35666315139fe6365af9",
			300: "fac11b0653b258f9764afe84a0fe054d1d937ee83581d6869e19ded88c82e1f8"}},
		{"airline", airline(t), airlineStress, map[uint64]string{
			60:  "883a5da9ea4a2413ca0af79cea4f28ea0f0907e6a68cdd1a06e9aa14f7578bc4",
			300: "c4fb0c2336d2220938d5c6566bfe89ad2d5d230dce6973888fc3d1cefa32d94b"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := sha256.New()
			steps := 0
			for seed := uint64(1); seed <= seeds; seed++ {
				cfg := env.Config{Seed: seed}
				if seed%2 == 0 {
					cfg = c.stress(t, seed)
				}
				steps += playOracle(t, c.e, cfg, h)
			}
			got := hex.EncodeToString(h.Sum(nil))
			t.Logf("%d seeds, %d steps: %s", seeds, steps, got)
			if got != c.want[seeds] {
				t.Errorf("the oracle's actions over %d seeds have digest %s, want %s", seeds, got, c.want[seeds])
			}
		})
	}
}

// playOracle plays one episode with the world's oracle, writing its actions to h.
func playOracle(t *testing.T, e env.Env, cfg env.Config, h hash.Hash) int {
	t.Helper()
	ep, err := e.NewEpisode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	obs, err := ep.Reset()
	if err != nil {
		t.Fatal(err)
	}
	agent := e.(env.Oracle).Oracle(cfg.Seed)
	for turn := uint32(0); ; turn++ {
		a, err := agent.Act(env.Turn{Step: turn, Observation: obs})
		if err != nil {
			t.Fatalf("seed %d step %d: %v", cfg.Seed, turn, err)
		}
		fmt.Fprintf(h, "%d %d %s %s\n", cfg.Seed, turn, a.Tool, a.Args)
		r, err := ep.Step(a)
		if err != nil {
			t.Fatal(err)
		}
		obs = r.Observation
		if r.Done() {
			return int(turn) + 1
		}
	}
}

// TestDecodeAnswerAgreesWithDecodeObs: the answers the plan reads are the values
// decodeObs gives made CEL values, on the observations oracle episodes see under faults
// (truncated answers included) and on JSON the fast reader leaves to encoding/json.
func TestDecodeAnswerAgreesWithDecodeObs(t *testing.T) {
	w, _ := Of(shopPort(t))
	a := w.oracle.adapter
	inputs := []string{
		`{}`, ` {"a":1} trailing`, `{"a":1,"a":2}`, `{"n":-0,"f":1.5,"e":1e3,"E":-2.5E-3,"big":9223372036854775808,"inf":1e400}`,
		`{"s":"\u00e9\n\"x\"","k\u0041":true}`, `{"s":"é"}`, `{"s":"` + "\xff" + `"}`, `{"x":[1,[2,{"y":null}],[]],"z":{}}`,
		`{"a":01}`, `{"a":1.}`, `{"a":.5}`, `{"a":-}`, `{"a":tru}`, `{"a":1,}`, `{"a" 1}`, `[1]`, `null`, ``, `{`, `{"a":"b`,
		`{"a":[1,]}`, `{"a":{"b":1}`, `{"a":1}{"b":2}`, "{\"a\":\"\t\"}",
		// Nested objects whose keys are their sibling's, or not quite.
		`{"l":[{"a":1,"b":2},{"a":3,"b":4},{"a":5},{"a":6,"b":7,"c":8},{},{},{"b":1,"a":2},{"a":1,"a":2,"b":3},{"a":1,"b":2,"a":3},{"a":1,"b":2,"b":4,"c":5}]}`,
		`{"a":{"x":{"q":1},"y":2},"b":{"x":{"q":3},"y":4},"c":{"x":{"y":5}},"d":{"q":[{"x":1}]}}`,
	}
	for _, e := range []env.Env{shopPort(t), bank(t), airline(t)} {
		for seed := uint64(1); seed <= 20; seed++ {
			cfg := env.Config{Seed: seed}
			if seed%2 == 0 {
				cfg = shopStress(t, seed)
			}
			ep, err := e.NewEpisode(cfg)
			if err != nil {
				t.Fatal(err)
			}
			obs, err := ep.Reset()
			if err != nil {
				t.Fatal(err)
			}
			agent := e.(env.Oracle).Oracle(seed)
			for turn := uint32(0); ; turn++ {
				inputs = append(inputs, string(obs))
				act, err := agent.Act(env.Turn{Step: turn, Observation: obs})
				if err != nil {
					t.Fatal(err)
				}
				r, err := ep.Step(act)
				if err != nil {
					t.Fatal(err)
				}
				if obs = r.Observation; r.Done() {
					break
				}
			}
		}
	}
	fast := 0
	for _, in := range inputs {
		want, wok := decodeObs([]byte(in))
		got, size, gok := decodeAnswer([]byte(in), a)
		if wok != gok {
			t.Fatalf("%.200q: decoded %v, want %v", in, gok, wok)
		}
		if !wok {
			continue
		}
		ws, gs := dumpAnswer(toVal(want, a)), dumpAnswer(got)
		if ws != gs {
			t.Fatalf("%.200q:\n got %s\nwant %s", in, gs, ws)
		}
		if want := valueSize(toVal(want, a)); size != want {
			t.Fatalf("%.200q: largest value %d, want %d", in, size, want)
		}
		d := answerDecoder{b: in, a: a}
		d.ws()
		if _, ok := d.object(0); ok {
			fast++
		}
	}
	if fast < len(inputs)/2 {
		t.Errorf("the fast reader took %d of %d inputs, want most of the episodes' observations", fast, len(inputs))
	}
}

// dumpAnswer prints a value with its CEL type at every level, map keys sorted.
func dumpAnswer(v ref.Val) string {
	switch x := v.(type) {
	case traits.Mapper:
		var keys []string
		for it := x.Iterator(); it.HasNext() == types.True; {
			keys = append(keys, string(it.Next().(types.String)))
		}
		slices.Sort(keys)
		s := "map{"
		for _, k := range keys {
			s += fmt.Sprintf("%q:%s,", k, dumpAnswer(x.Get(types.String(k))))
		}
		return s + "}"
	case traits.Lister:
		s := "list["
		for i := range int64(x.Size().(types.Int)) {
			s += dumpAnswer(x.Get(types.Int(i))) + ","
		}
		return s + "]"
	}
	return fmt.Sprintf("%s(%#v)", v.Type().TypeName(), v.Value())
}

// TestPlanCostUnderEstimate: a plan expression the oracle runs without cost tracking
// costs, tracked, no more than CEL's estimate on the sizes that let it run so (which
// boundPlan keeps under the limit), on the answers of oracle episodes under faults; and
// the expressions that read the shop's search results run so.
func TestPlanCostUnderEstimate(t *testing.T) {
	runs := map[string]int{}
	checkPlanCost = func(p *program, a planVars) {
		_, det, err := p.prg.Eval(a)
		if err != nil {
			return // an error of the expression: the same either way
		}
		est, err := a.o.p.env.EstimateCost(p.ast, planSizes{max: 1<<a.o.largest - 1})
		if err != nil {
			t.Fatal(err)
		}
		if c := *det.ActualCost(); c > est.Max || est.Max > maxCost {
			t.Errorf("%s: cost %d, estimate %d (limit %d) on values of at most %d", p.src, c, est.Max, maxCost, 1<<a.o.largest-1)
		}
		runs[p.src]++
	}
	defer func() { checkPlanCost = nil }()
	h := sha256.New()
	for _, e := range []env.Env{shopPort(t), bank(t), airline(t)} {
		for seed := uint64(1); seed <= 40; seed++ {
			cfg := env.Config{Seed: seed}
			if seed%2 == 0 {
				cfg = shopStress(t, seed)
			}
			playOracle(t, e, cfg, h)
		}
	}
	w, _ := Of(shopPort(t))
	if src := w.oracle.steps[1].when.src; runs[src] == 0 {
		t.Errorf("the shop's first stock check never ran untracked: %q", src)
	}
}

// TestPlanClosuresAgreeWithCEL: every plan expression of the shop file, the bank and the
// airline that runs without cost tracking is compiled to closures, and each evaluation
// its closure answers on oracle episodes under faults is what CEL's interpreter gives;
// the shop's stock checks (its candidate filter) are answered by their closures.
func TestPlanClosuresAgreeWithCEL(t *testing.T) {
	for _, e := range []env.Env{shopPort(t), bank(t), airline(t)} {
		w := worldOf(e)
		withCheck(t, func(c *closureCheck) {
			h := sha256.New()
			for seed := uint64(1); seed <= 40; seed++ {
				cfg := env.Config{Seed: seed}
				if seed%2 == 0 {
					cfg = shopStress(t, seed)
				}
				playOracle(t, e, cfg, h)
			}
			compiled := 0
			for _, s := range w.oracle.steps {
				ps := []*program{s.when}
				for _, call := range []*oracleCall{&s.call, s.recover} {
					if call != nil {
						for _, f := range call.args {
							ps = append(ps, f.val)
						}
					}
				}
				for _, p := range ps {
					if p == nil || p.fast == nil {
						continue
					}
					if p.run == nil {
						t.Errorf("%s: %s runs on the interpreter: %q", w.name, p.at.field, p.src)
						continue
					}
					compiled++
				}
			}
			if compiled == 0 || c.checked == 0 {
				t.Errorf("%s: nothing compared (%d compiled, %d evaluations)", w.name, compiled, c.checked)
			}
			t.Logf("%s: %d plan expressions compiled, %d evaluations compared", w.name, compiled, c.checked)
			if w.name == "shop_world" {
				for _, i := range []int{1, 2} {
					if p := w.oracle.steps[i].when; c.decided[p] == 0 {
						t.Errorf("the shop's %s never answered by its closure: %q", w.oracle.steps[i].name, p.src)
					}
				}
			}
		})
	}
}

// TestPlanMemoSeesNewResults: a plan expression remembered while the results stay the
// same is computed again once a step's answer is added. The shop file's first two
// stock checks are given a condition on the number of answers, a comprehension over
// results, which holds whenever they run (1 answer before the first, 2 before the
// second) but which a value remembered across the first answer would make false: the
// oracle's actions must stay the file's own, without faults and under them.
func TestPlanMemoSeesNewResults(t *testing.T) {
	playShopWithConditions(t, map[string]string{"stock1": "size(results.filter(k, true)) == 1", "stock2": "size(results.filter(k, true)) == 2"})
}

// TestPlanMemoForgetsWhatItReads: a remembered plan expression that names the answers
// it reads is kept across the others and computed again when one of its own is added.
// The shop file's first two stock checks are given a condition on whether stock1's
// answer is there, a comprehension naming it ('stock1' in results): before the first
// check it is not (the condition holds), before the second it is (it holds again), so
// a value kept across stock1's answer makes the second check false. The search's
// candidate filter, named by results.search, is kept across every stock check.
func TestPlanMemoForgetsWhatItReads(t *testing.T) {
	const named = "size([0].filter(k, 'stock1' in results))"
	w := playShopWithConditions(t, map[string]string{"stock1": named + " == 0", "stock2": named + " == 1"})
	var stock1, search bool
	for _, r := range w.planReads {
		stock1 = stock1 || !r.all && slices.Equal(r.names, []string{"stock1"})
		search = search || !r.all && slices.Equal(r.names, []string{"search"})
	}
	if !stock1 || !search {
		t.Errorf("the remembered expressions read %+v: want one naming stock1 alone, one naming search alone", w.planReads)
	}
}

// TestResultsRead: what a remembered plan expression reads of the results.
func TestResultsRead(t *testing.T) {
	data, err := os.ReadFile("../../../examples/worlds/shop.yaml")
	if err != nil {
		t.Fatal(err)
	}
	w, err := Load("shop.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	planEnv := w.oracle.env
	for _, c := range []struct {
		expr  string
		all   bool
		names []string
	}{
		{"results.search.results.filter(h, h.price > task.qty)", false, []string{"search"}},
		{"size(results.search.results) + results.stock1.stock", false, []string{"search", "stock1"}},
		{"results['order'].order_id", false, []string{"order"}},
		{"size([0].filter(k, 'stock1' in results))", false, []string{"stock1"}},
		{"task.item.split(' ')", false, nil},
		{"['stock1', 'stock2'].filter(n, n in results && results[n].stock > 0)", true, nil},
		{"size(results)", true, nil},
		{"results.filter(k, true)", true, nil},
		{"cel.bind(r, results, r.search)", true, nil},
	} {
		ast, iss := planEnv.Compile(c.expr)
		if iss.Err() != nil {
			t.Fatalf("%s: %v", c.expr, iss.Err())
		}
		got := resultsRead(ast.NativeRep().Expr())
		if got.all != c.all || !slices.Equal(got.names, c.names) {
			t.Errorf("%s: reads %+v, want all %v, names %v", c.expr, got, c.all, c.names)
		}
	}
}

// playShopWithConditions plays the shop file's oracle with a condition put before each
// named step's own, over 60 seeds (faults on every second), and fails unless its
// actions are the file's own; it returns the world it loaded.
func playShopWithConditions(t *testing.T, conds map[string]string) *World {
	t.Helper()
	data, err := os.ReadFile("../../../examples/worlds/shop.yaml")
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	var steps []string
	for name, cond := range conds {
		old := "- name: " + name + "\n      when: "
		if !strings.Contains(text, old) {
			t.Fatalf("the shop file has no step %s with a condition", name)
		}
		text = strings.Replace(text, old, old+cond+" && ", 1)
		steps = append(steps, name)
	}
	w, err := Load("shop.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range w.oracle.steps {
		if slices.Contains(steps, s.name) && s.when.run == nil {
			t.Fatalf("%s: its condition is not compiled: %q", s.name, s.when.src)
		}
	}
	want, got := sha256.New(), sha256.New()
	for seed := uint64(1); seed <= 60; seed++ {
		cfg := env.Config{Seed: seed}
		if seed%2 == 0 {
			cfg = shopStress(t, seed)
		}
		playOracle(t, shopPort(t), cfg, want)
		if seed%2 == 0 {
			cfg = shopStress(t, seed) // a fresh injector: the first one was used
		}
		playOracle(t, w.Env(), cfg, got)
	}
	if !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		t.Errorf("with conditions %v, the oracle's actions differ from the shop file's", conds)
	}
	return w
}
