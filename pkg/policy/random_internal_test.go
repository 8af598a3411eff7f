package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
)

// TestSchemaCacheGivesTheParse: the cache answers what parseSchema answers, keeps a
// schema once (the second answer is the first's slice), never keeps an invalid one, and
// keeps no more than maxSchemas while still answering every schema past them.
func TestSchemaCacheGivesTheParse(t *testing.T) {
	var c schemaCache
	schema := func(i int) json.RawMessage {
		return json.RawMessage(fmt.Sprintf(`{"type":"object","required":["a"],"properties":{"a":{"type":"integer","minimum":%d},"b":{"type":"string","maxLength":%d},"c":{"enum":["x","y"]}}}`, i, i+1))
	}
	for i := range maxSchemas + 50 {
		raw := schema(i)
		want, err := parseSchema(raw)
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.parse(raw)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("schema %d: cache gives %+v, %v; parseSchema %+v", i, got, err, want)
		}
		again, _ := c.parse(raw)
		if kept, want := &again[0] == &got[0], i < maxSchemas; kept != want {
			t.Fatalf("schema %d: kept %v, want %v", i, kept, want)
		}
	}
	if len(c.m) != maxSchemas {
		t.Errorf("cache holds %d schemas, want its bound %d", len(c.m), maxSchemas)
	}
	bad := json.RawMessage(`{"properties":[`)
	for range 2 {
		if _, err := c.parse(bad); err == nil {
			t.Fatal("an invalid schema parsed")
		}
	}
	if _, kept := c.m[string(bad)]; kept {
		t.Error("an invalid schema was kept")
	}
}

// TestSchemaCacheShared: agents made at once on several goroutines read the same
// parsed schema and act as an agent made alone does (go test -race).
func TestSchemaCacheShared(t *testing.T) {
	e := fakeSchemaEnv(`{"type":"object","required":["q"],"properties":{"q":{"type":"string","maxLength":5},"n":{"type":"integer","maximum":3}}}`)
	act := func() string {
		a, err := randomPolicy{}.NewAgent(e, 7)
		if err != nil {
			t.Error(err)
			return ""
		}
		var out []byte
		for range 20 {
			x, err := a.Act(envTurn(`{"id":"abc-1"}`))
			if err != nil {
				t.Error(err)
			}
			out = append(append(out, x.Args...), '\n')
		}
		return string(out)
	}
	want := act()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if got := act(); got != want {
				t.Errorf("an agent made beside others acted\n%s\nwant\n%s", got, want)
			}
		})
	}
	wg.Wait()
}

// schemaEnv is an env of one tool with the given schema, for the policy's agents only.
type schemaEnv struct{ schema string }

func fakeSchemaEnv(schema string) schemaEnv { return schemaEnv{schema} }

func (s schemaEnv) Spec() env.Spec {
	return env.Spec{Name: "fake", Tools: []env.Tool{{Name: "t", Schema: json.RawMessage(s.schema)}}}
}

func (schemaEnv) NewEpisode(env.Config) (env.Episode, error) { return nil, errors.New("no episodes") }

func envTurn(obs string) env.Turn { return env.Turn{Observation: json.RawMessage(obs)} }

// TestAppendJSONIsMarshal: appendJSON writes every kind of value the agent makes as
// json.Marshal does, escapes and edges included.
func TestAppendJSONIsMarshal(t *testing.T) {
	vals := []any{
		int64(0), int64(-1), int64(math.MaxInt64), int64(math.MinInt64), true, false, nil,
		"", "sku-3f2a", "o-1", "a b", `q"uote`, `back\slash`, "<tag>", "a&b", "\x00", "\x1f", "\x7f",
		"é", "\xff", "\u2028", 0.0, 1.5, -3.25, 1e21, 1e-7, json.RawMessage(`"a"`), json.RawMessage(` { "k" : 1 } `),
		[]any{}, map[string]any{},
	}
	for c := range 256 {
		vals = append(vals, string([]byte{'x', byte(c), 'y'}))
	}
	for _, v := range vals {
		want, err := json.Marshal(v)
		got, gotErr := appendJSON([]byte("pre"), v)
		if (err == nil) != (gotErr == nil) || err == nil && string(got) != "pre"+string(want) {
			t.Errorf("%#v: appendJSON %q (%v), json.Marshal %q (%v)", v, got, gotErr, want, err)
		}
	}
}

// TestLearnKeepsTokens: learn keeps the runs of letters, digits, '-', '_' and '.' of 2
// to 40 bytes with a letter, in the order they come, once each.
func TestLearnKeepsTokens(t *testing.T) {
	a := &randomAgent{seen: map[string]struct{}{}}
	a.learn([]byte(`{"sku":"sku-3f2a","n":12,"x":"a","t":"3.5e-2 o_1 o_1 ` + strings.Repeat("z", 41) + ` é-b"}`))
	want := []string{"sku", "sku-3f2a", "3.5e-2", "o_1", "-b"}
	if !reflect.DeepEqual(a.order, want) {
		t.Errorf("learned %q, want %q", a.order, want)
	}
}

// BenchmarkRandomAct is the random agent's cost per action on a shop-sized tool list
// and an observation of a catalog search's size.
func BenchmarkRandomAct(b *testing.B) {
	e := fakeSchemaEnv(`{"type":"object","required":["sku","qty"],"properties":{"sku":{"type":"string","maxLength":32},"qty":{"type":"integer","minimum":1,"maximum":1000},"note":{"type":"string"}}}`)
	obs := envTurn(`{"ok":true,"total":3,"results":[{"sku":"sku-3f2a","name":"red mug","price":12},{"sku":"sku-91c0","name":"steel kettle","price":40},{"sku":"sku-0b7e","name":"eco teapot","price":22}]}`)
	a, err := randomPolicy{}.NewAgent(e, 1)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := a.Act(obs); err != nil {
			b.Fatal(err)
		}
	}
}
