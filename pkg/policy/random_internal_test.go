package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
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
