package world

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"

	"github.com/gauntlet-rl/gauntlet/pkg/canonjson"
	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
)

// drawn is a world whose draws are each one documented call of the generator, the
// order docs/worlds.md (Draws) gives, so a Go env's generation can be written in it.
const drawn = `name: drawn
services: [svc]
random: {state: my/state, latency: my/latency}
identify: false
vars:
  perm: {type: list(int), shuffle: 7}
  bits: {type: int, random_bits: 32}
  skipped: {type: int, uniform: [0, 9], when: "perm[0] > 100", else: "perm[1] * 10"}
  coin: {type: bool, bernoulli: 0.5, when: "perm[0] <= 100"}
  # Rejection sampling: a and b drawn again while they are equal.
  a: {type: int, uniform: [0, 2]}
  b: {type: int, uniform: [0, 2], redraw: {from: a, while: a == b}}
  wallet: {type: int, value: 10, path: wallet/balance}
entities:
  item:
    key: code
    path: stock
    count: {value: 2}
    fields:
      n: {type: int, random_bits: 8}
      code: {type: string, expr: "'c' + string(self.n % 2)", redraw: {from: n, while: self.code in item}}
      qty: {type: int, value: 1}
progress:
  - {milestone: looked, description: an item was read}
tools:
  - name: take
    service: svc
    description: take one of an item
    args:
      type: object
      properties:
        code: {type: string, maxLength: 8}
      required: [code]
    preconditions:
      - {require: args.code in item, error: "no item ${quote(args.code)}", suggestion: list them}
    effects:
      - {set: item.qty, key: args.code, to: "item[args.code].qty - 1"}
      - {set: wallet, to: wallet - 1}
    observation:
      items:
        each: item.transformList(k, v, k)
        as: c
        fields: {zcode: c, qty: "item[c].qty"}
    reach:
      - {milestone: looked, read: true}
success: wallet < 0
`

// TestDrawsAreTheGeneratorsCalls: shuffle is rand.Perm, random_bits 32 is Uint32, a draw
// whose when is false calls nothing, redraw draws again from the value it names, and
// the generator is the one random.state names.
func TestDrawsAreTheGeneratorsCalls(t *testing.T) {
	w, err := Load("drawn.yaml", []byte(drawn))
	if err != nil {
		t.Fatal(err)
	}
	for seed := uint64(1); seed <= 50; seed++ {
		ep := &episode{w: w, maxSteps: w.maxSteps, deadlineMs: w.deadlineMs, maxInvalid: w.maxInvalid}
		obs, err := ep.reset(seed)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(obs), `"world"`) || strings.Contains(string(obs), `"digest"`) {
			t.Fatalf("identify: false, yet %s", obs)
		}
		r := rng.New(seed, "my/state", 0)
		perm := r.Perm(7)
		bits := r.Uint32()
		coin := r.Float64() < 0.5
		a, b := r.IntN(3), r.IntN(3)
		for a == b {
			a, b = r.IntN(3), r.IntN(3)
		}
		got := func(name string) ref.Val { return ep.vars[w.slots[name]] }
		l := got("perm").(traits.Lister)
		for i, p := range perm {
			if l.Get(types.Int(i)) != types.Int(p) {
				t.Fatalf("seed %d: perm %v, rand.Perm %v", seed, l, perm)
			}
		}
		if got("bits") != types.Int(bits) || got("skipped") != types.Int(perm[1]*10) || got("coin") != types.Bool(coin) ||
			got("a") != types.Int(a) || got("b") != types.Int(b) {
			t.Fatalf("seed %d: bits %v skipped %v coin %v a %v b %v; want %d %d %v %d %d", seed,
				got("bits"), got("skipped"), got("coin"), got("a"), got("b"), bits, perm[1]*10, coin, a, b)
		}
		if ids := ep.ents[0].ids; len(ids) != 2 || ids[0] == ids[1] || !strings.HasPrefix(ids[0], "c") || ep.ents[0].objs[0].vals[0] != types.String(ids[0]) {
			t.Fatalf("seed %d: ids %v, not two codes", seed, ids)
		}
	}
}

// TestKeyedDrawThatCannotEnd: a redraw that always rejects is an error naming its place,
// found when the world loads.
func TestKeyedDrawThatCannotEnd(t *testing.T) {
	three := strings.Replace(drawn, "count: {value: 2}", "count: {value: 3}", 1)
	_, err := Load("drawn.yaml", []byte(three))
	if err == nil || !strings.Contains(err.Error(), "entities.item.fields.code.redraw.while: seed 1: still rejected after 10000 redraws") {
		t.Fatalf("got %v", err)
	}
	dup := strings.Replace(strings.Replace(drawn, ", redraw: {from: n, while: self.code in item}", "", 1), "random_bits: 8", "value: 1", 1)
	if _, err := Load("drawn.yaml", []byte(dup)); err == nil || !strings.Contains(err.Error(), `drawn.yaml:16:10: entities.item.key: seed 1: key "c1" is empty or already another item's id`) {
		t.Fatalf("got %v", err)
	}
}

// TestKeysPathsOrderedAnswersAndReads: ids from the key field name entities in
// expressions and diffs, under the entity's path; a variable's diff uses its path; an
// answer's list of objects keeps the keys in the file's order; an error template quotes
// the agent's text as %q does; a read's milestone counts only when its answer arrives
// whole.
func TestKeysPathsOrderedAnswersAndReads(t *testing.T) {
	w, err := Load("drawn.yaml", []byte(drawn))
	if err != nil {
		t.Fatal(err)
	}
	e := w.Env()
	for _, cut := range []bool{false, true} {
		cfg := env.Config{Seed: 4}
		if cut {
			cfg.Faults = injector(t, 4, truncate("cut", "svc", 1, 0.5))
		}
		ep, err := e.NewEpisode(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ep.Reset(); err != nil {
			t.Fatal(err)
		}
		code := ep.(*episode).ents[0].ids[1]
		r, err := ep.Step(env.Action{Tool: "take", Args: json.RawMessage(`{"code":"` + code + `"}`)})
		if err != nil {
			t.Fatal(err)
		}
		want := `[{"op":"set","path":"stock/` + code + `/qty","from":1,"to":0},{"op":"set","path":"wallet/balance","from":10,"to":9}]`
		if string(r.Diff) != want {
			t.Fatalf("diff %s, want %s", r.Diff, want)
		}
		if cut {
			if r.Signals.GetProgress() != 0 || !strings.HasPrefix(string(r.Observation), `{"truncated":true`) {
				t.Fatalf("a cut read reached progress %v: %s", r.Signals.GetProgress(), r.Observation)
			}
			continue
		}
		if r.Signals.GetProgress() != 1 || !strings.Contains(string(r.Observation), `{"zcode":"`+code+`","qty":0}`) {
			t.Fatalf("progress %v, answer %s", r.Signals.GetProgress(), r.Observation)
		}
		r, err = ep.Step(env.Action{Tool: "take", Args: json.RawMessage(`{"code":"a\"b"}`)})
		if err != nil {
			t.Fatal(err)
		}
		if want := `{"ok":false,"error":"no item \"a\\\"b\"","suggestion":"list them"}`; string(r.Observation) != want {
			t.Fatalf("answer %s, want %s", r.Observation, want)
		}
	}
}

// TestGoStringsIsEncodingJSON: json_strings: go writes every string as encoding/json
// does, whatever it holds, and leaves a document already in that form as it is.
func TestGoStringsIsEncodingJSON(t *testing.T) {
	for _, s := range []string{"", "plain", "a\nb\tc\r\b\f\x01\x1f", "<a href=\"x\">&amp;</a>", "\u2028\u2029", "\xff\xfe bad", "é ü ✓ \U0001F600",
		`back\slash \u003c`, "\x7f", strings.Repeat("<", 40)} {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		got := goStrings(canonjson.AppendString(nil, s))
		if string(got) != string(want) {
			t.Errorf("%q: got %s, want %s", s, got, want)
		}
		if again := goStrings(got); string(again) != string(got) {
			t.Errorf("%q: rewritten twice: %s", s, again)
		}
	}
}

// TestGoAlreadyIsTheFourSearches: goAlready's one pass answers what the four searches
// it replaced answered, on the documents goStrings meets and on their cut ends (an
// escape or a character split at the last bytes).
func TestGoAlreadyIsTheFourSearches(t *testing.T) {
	searches := func(b []byte) bool {
		return !bytes.ContainsAny(b, "<>&") && !bytes.Contains(b, []byte(`\u00`)) &&
			!bytes.Contains(b, []byte("\u2028")) && !bytes.Contains(b, []byte("\u2029"))
	}
	docs := []string{"", `{"a":"plain"}`, `\u00`, `\u0`, `\u`, `\`, `\\u00`, `\u2028`, `\u0026`, "<", ">", "&",
		"\u2028", "\u2029", "\u2027", "\u202a", "\xe2", "\xe2\x80", "\xe2\x80\xa8", "\xe2\x81\xa8", "é ü ✓",
		`{"q":"a \"b\" \n c"}`}
	r := rand.New(rand.NewPCG(7, 7))
	alphabet := []byte{'a', '"', '\\', 'u', '0', '2', '8', '<', '&', 0xe2, 0x80, 0xa8, 0xa9}
	for range 20000 {
		b := make([]byte, r.IntN(9))
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		docs = append(docs, string(b))
	}
	for _, d := range docs {
		if got, want := goAlready([]byte(d)), searches([]byte(d)); got != want {
			t.Errorf("goAlready(%q) = %v, the searches %v", d, got, want)
		}
	}
}

// TestGoStringsOncePerAnswer: with json_strings: go, an answer rewritten before its
// cut is not rewritten again as the observation: every observation, whole, cut or an
// invalid action's, is what rewriting it again gives, its strings in Go's form.
func TestGoStringsOncePerAnswer(t *testing.T) {
	w, err := Load("drawn.yaml", []byte(strings.Replace(drawn, "identify: false\n", "identify: false\njson_strings: go\n", 1)))
	if err != nil {
		t.Fatal(err)
	}
	for _, cut := range []bool{false, true} {
		cfg := env.Config{Seed: 4}
		if cut {
			cfg.Faults = injector(t, 4, truncate("cut", "svc", 1, 0.5))
		}
		ep, err := w.Env().NewEpisode(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ep.Reset(); err != nil {
			t.Fatal(err)
		}
		for _, a := range []env.Action{
			{Tool: "take", Args: json.RawMessage(`{"code":"<&>"}`)},
			{Tool: "take", Args: json.RawMessage(`{"code":"\u2028"}`)},
			{Tool: "take", Args: json.RawMessage(`{"code":"<&> too long for it"}`)},
			{Tool: "<&>", Args: json.RawMessage(`{}`)},
		} {
			r, err := ep.Step(a)
			if err != nil {
				t.Fatal(err)
			}
			obs := string(r.Observation)
			if again := string(goStrings([]byte(obs))); again != obs || strings.ContainsAny(obs, "<&>") || strings.Contains(obs, "\u2028") {
				t.Errorf("cut %v, %s %s: observation %s, rewritten again %s", cut, a.Tool, a.Args, obs, again)
			}
		}
	}
}

// FuzzGoStrings: goStrings of canonjson's string is encoding/json's.
func FuzzGoStrings(f *testing.F) {
	for _, s := range []string{"", "a\nb", "<&>", "\u2028", "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := goStrings(canonjson.AppendString(nil, s)); string(got) != string(want) {
			t.Fatalf("%q: got %s, want %s", s, got, want)
		}
	})
}

// TestNewKeysAreCheckedWithTheirPlace: every misuse of the draws, keys, paths,
// milestones and ordered answers is refused, all at once, each naming its line and field.
func TestNewKeysAreCheckedWithTheirPlace(t *testing.T) {
	bad := strings.NewReplacer(
		"random: {state: my/state, latency: my/latency}", "random: {state: my/state, seed: 3}\njson_strings: html",
		"perm: {type: list(int), shuffle: 7}", "perm: {type: list(int), shuffle: 7}\n  p2: {type: int, shuffle: 3}\n  p3: {type: list(int), value: 1}",
		"skipped: {type: int, uniform: [0, 9], when: \"perm[0] > 100\", else: \"perm[1] * 10\"}", "skipped: {type: int, value: 3, when: \"true\"}\n  lone: {type: int, uniform: [0, 1], else: 0}",
		"redraw: {from: a, while: a == b}", "redraw: {from: wallet, while: a == b, until: 3}",
		"path: wallet/balance", "path: /wallet",
		"key: code", "key: qty",
		"qty: {type: int, value: 1}", "qty: {type: int, value: 1, path: x}\n      l: {type: list(int), shuffle: 2}",
		"{milestone: looked, description: an item was read}", "{milestone: looked}\n  - {description: no name}",
		"{milestone: looked, read: true}", "{milestone: seen, read: yes}",
		"as: c", "as: wallet",
		"{set: wallet, to: wallet - 1}", "{set: perm, to: perm}",
	).Replace(drawn)
	_, err := Load("w.yaml", []byte(bad))
	if err == nil {
		t.Fatal("loaded")
	}
	for _, want := range []string{
		`^w\.yaml:3:\d+: random\.seed: unknown key`,
		`^w\.yaml:4:\d+: json_strings: want canonical or go, got "html"`,
		`^w\.yaml:\d+:\d+: vars\.p2\.shuffle: shuffle draws a list\(int\); the type is int`,
		`^w\.yaml:\d+:\d+: vars\.p3\.value: a list\(int\) is drawn by shuffle or computed by expr`,
		`^w\.yaml:\d+:\d+: vars\.skipped\.when: when decides whether a random draw happens`,
		`^w\.yaml:\d+:\d+: vars\.lone\.else: else is the value when the draw's when is false: add when`,
		`^w\.yaml:\d+:\d+: vars\.b\.redraw\.until: unknown key`,
		`^w\.yaml:\d+:\d+: vars\.b\.redraw\.from: want this value or one declared before it, got "wallet"`,
		`^w\.yaml:\d+:\d+: vars\.wallet\.path: want 1 to 64 printable ASCII characters without spaces`,
		`^w\.yaml:\d+:\d+: entities\.item\.key: want a string field of item`,
		`^w\.yaml:\d+:\d+: entities\.item\.fields\.qty\.path: a field has no path of its own`,
		`^w\.yaml:\d+:\d+: entities\.item\.fields\.l\.type: list\(int\) is a variable's type, not a field's`,
		`^w\.yaml:\d+:\d+: progress\[1\]\.milestone: required: the name tools reach it by`,
		`^w\.yaml:\d+:\d+: tools\[0\]\.reach\[0\]\.milestone: unknown milestone "seen"`,
		`^w\.yaml:\d+:\d+: tools\[0\]\.reach\[0\]\.read: `,
		`^w\.yaml:\d+:\d+: tools\[0\]\.observation\.items\.as: "wallet" is already a name of the world`,
		`^w\.yaml:\d+:\d+: tools\[0\]\.effects\[1\]\.set: perm is a list\(int\): drawn, never set`,
	} {
		re := regexp.MustCompile(want)
		found := false
		for _, l := range strings.Split(err.Error(), "\n") {
			found = found || re.MatchString(l)
		}
		if !found {
			t.Errorf("no error matches %s in:\n%s", want, err)
		}
	}
	keyed := strings.Replace(drawn, "      - {set: wallet, to: wallet - 1}", "      - {set: wallet, to: wallet - 1}\n      - {add: item, fields: {qty: 2}}", 1)
	if _, err := Load("w.yaml", []byte(keyed)); err == nil || !regexp.MustCompile(`w\.yaml:\d+:\d+: tools\[0\]\.effects\[2\]\.add: item takes its ids from its key field`).MatchString(err.Error()) {
		t.Errorf("a tool adds to a keyed entity: %v", err)
	}
}

// TestDescribeShowsTheDraws: gauntlet worlds describe says how each value is drawn
// (shuffle, bits, when, redraw), where ids come from, diff paths and the milestones calls
// reach.
func TestDescribeShowsTheDraws(t *testing.T) {
	w, err := Load("drawn.yaml", []byte(drawn))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := w.Describe(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"generators: state my/state, latency my/latency",
		"perm list(int) = shuffle of 0..7-1",
		"bits int = 32 random bits",
		"skipped int = uniform[0, 9] when perm[0] > 100, else perm[1] * 10",
		"b int = uniform[0, 2] (from a, drawn again while a == b)",
		"wallet int = 10 (in diffs wallet/balance)",
		"item (ids its code; in diffs stock; 2 at start)",
		"reaches (unless its answer is cut) milestone looked",
		"1: looked (reached by calls)",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no %q in:\n%s", want, b.String())
		}
	}
}
