package policy

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
)

// randomPolicy calls a uniformly random tool of the env's action space. Arguments follow
// the tool's JSON Schema: strings are mostly tokens seen in earlier observations (ids such
// as "sku-3f2a" or "o-1", words of the task), otherwise random words; integers and numbers
// are small, within the schema's bounds; enums pick a listed value.
type randomPolicy struct{}

func (randomPolicy) Name() string { return Random }

func (randomPolicy) NewAgent(e env.Env, seed uint64) (env.Agent, error) {
	spec := e.Spec()
	if len(spec.Tools) == 0 {
		return nil, fmt.Errorf("policy %s: env %q has no tools", Random, spec.Name)
	}
	a := &randomAgent{r: rng.New(seed, "policy/"+Random, 0), seen: map[string]struct{}{}, tools: make([]tool, 0, len(spec.Tools))}
	for _, t := range spec.Tools {
		props, err := schemas.parse(t.Schema)
		if err != nil {
			return nil, fmt.Errorf("policy %s: env %q tool %q: schema: %w", Random, spec.Name, t.Name, err)
		}
		a.tools = append(a.tools, tool{name: t.Name, props: props})
	}
	return a, nil
}

type tool struct {
	name  string
	props []prop // sorted by name, so args encode in one order
}

// prop is one argument as far as the random policy understands JSON Schema.
type prop struct {
	name     string
	key      []byte // name as JSON, with its quotes
	typ      string
	required bool
	min, max *float64
	maxLen   *int
	enum     []json.RawMessage
}

// schemas holds the arguments parsed from each tool schema the random policy has met,
// keyed by the schema's bytes: every episode of an env offers the same schemas, and
// parsing them again for each episode was a twentieth of the pipeline's CPU. Agents
// only read the props they share. Past maxSchemas distinct schemas (an env whose tools
// change from episode to episode), new ones are parsed and not kept.
var schemas schemaCache

// maxSchemas bounds the schemas kept.
const maxSchemas = 4096

type schemaCache struct {
	mu sync.RWMutex
	m  map[string][]prop
}

// parse is parseSchema(raw), from the cache when raw was parsed before. An invalid
// schema is never kept: its error is parseSchema's each time.
func (c *schemaCache) parse(raw json.RawMessage) ([]prop, error) {
	c.mu.RLock()
	props, ok := c.m[string(raw)]
	c.mu.RUnlock()
	if ok {
		return props, nil
	}
	props, err := parseSchema(raw)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.m == nil {
		c.m = make(map[string][]prop)
	}
	if len(c.m) < maxSchemas {
		c.m[string(raw)] = props
	}
	c.mu.Unlock()
	return props, nil
}

func parseSchema(raw json.RawMessage) ([]prop, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	var s struct {
		Properties map[string]struct {
			Type      any               `json:"type"`
			Minimum   *float64          `json:"minimum"`
			Maximum   *float64          `json:"maximum"`
			MaxLength *int              `json:"maxLength"`
			Enum      []json.RawMessage `json:"enum"`
		} `json:"properties"`
		Required []string `json:"required"`
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, err
	}
	props := make([]prop, 0, len(s.Properties))
	for name, p := range s.Properties {
		typ, _ := p.Type.(string) // a list of types or none: any JSON value will do
		key, err := json.Marshal(name)
		if err != nil {
			return nil, err
		}
		props = append(props, prop{
			name: name, key: key, typ: typ, required: slices.Contains(s.Required, name),
			min: p.Minimum, max: p.Maximum, maxLen: p.MaxLength, enum: p.Enum,
		})
	}
	slices.SortFunc(props, func(a, b prop) int {
		switch {
		case a.name < b.name:
			return -1
		case a.name > b.name:
			return 1
		}
		return 0
	})
	return props, nil
}

// maxSeen bounds the tokens an agent remembers; the oldest are forgotten first.
const maxSeen = 256

type randomAgent struct {
	r     *rand.Rand
	tools []tool
	// order holds the tokens seen in observations, oldest first until it is full; then it
	// is a ring whose oldest entry is at next. seen indexes it.
	order []string
	seen  map[string]struct{}
	next  int
}

// words are the strings the agent falls back on when it has seen nothing, or by chance.
var words = []string{"x", "id", "test", "item", "foo", "bar", "red", "blue", "one", "new", "ok", "none"}

// Act picks a uniformly random tool and fills its arguments.
func (a *randomAgent) Act(t env.Turn) (env.Action, error) {
	a.learn(t.Observation)
	tl := a.tools[a.r.IntN(len(a.tools))]
	b := make([]byte, 1, 64)
	b[0] = '{'
	for _, p := range tl.props {
		if !p.required && a.r.IntN(2) == 0 {
			continue
		}
		if len(b) > 1 {
			b = append(b, ',')
		}
		b = append(append(b, p.key...), ':')
		var err error
		if b, err = appendJSON(b, a.value(p)); err != nil {
			return env.Action{}, fmt.Errorf("policy %s: %s.%s: %w", Random, tl.name, p.name, err)
		}
	}
	b = append(b, '}')
	return env.Action{Tool: tl.name, Args: b}, nil
}

// appendJSON appends v as json.Marshal writes it: an int, a bool, nil and a string
// that needs no escaping (the tokens and words the agent uses) directly; anything else
// (a number, an enum's value, a string to escape) through json.Marshal.
func appendJSON(b []byte, v any) ([]byte, error) {
	switch x := v.(type) {
	case int64:
		return strconv.AppendInt(b, x, 10), nil
	case bool:
		return strconv.AppendBool(b, x), nil
	case nil:
		return append(b, "null"...), nil
	case string:
		if plainJSON(x) {
			return append(append(append(b, '"'), x...), '"'), nil
		}
	}
	m, err := json.Marshal(v)
	if err != nil {
		return b, err
	}
	return append(b, m...), nil
}

// plainJSON reports whether json.Marshal writes s as it is between quotes: printable
// ASCII with no quote, backslash or character it escapes for HTML.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

func (a *randomAgent) value(p prop) any {
	if len(p.enum) > 0 {
		return p.enum[a.r.IntN(len(p.enum))]
	}
	switch p.typ {
	case "integer":
		lo, hi := a.bounds(p)
		lo, hi = math.Ceil(lo), math.Floor(hi)
		if hi < lo {
			return int64(lo)
		}
		return int64(lo) + a.r.Int64N(int64(hi-lo)+1)
	case "number":
		lo, hi := a.bounds(p)
		return lo + a.r.Float64()*(hi-lo)
	case "boolean":
		return a.r.IntN(2) == 0
	case "string", "":
		s := words[a.r.IntN(len(words))]
		if len(a.order) > 0 && a.r.IntN(4) != 0 {
			s = a.order[a.r.IntN(len(a.order))]
		}
		if p.maxLen != nil && len(s) > *p.maxLen {
			s = s[:max(0, *p.maxLen)]
		}
		return s
	case "array":
		return []any{}
	case "object":
		return map[string]any{}
	}
	return nil
}

// bounds is the small range integers and numbers are drawn from: ten values from the
// schema's minimum (or 0), capped by its maximum.
func (a *randomAgent) bounds(p prop) (lo, hi float64) {
	if p.min != nil {
		lo = *p.min
	}
	hi = lo + 9
	if p.max != nil && *p.max < hi {
		hi = max(*p.max, lo)
	}
	return lo, hi
}

// learn remembers the tokens of an observation: runs of letters, digits, '-', '_' and '.'
// of 2 to 40 bytes that contain a letter, such as ids and words.
func (a *randomAgent) learn(obs []byte) {
	for i := 0; i < len(obs); {
		if tokBytes[obs[i]] == 0 {
			i++
			continue
		}
		j, letter := i, false
		for ; j < len(obs) && tokBytes[obs[j]] != 0; j++ {
			letter = letter || tokBytes[obs[j]] == tokLetter
		}
		if n := j - i; letter && n >= 2 && n <= 40 {
			if _, ok := a.seen[string(obs[i:j])]; !ok { // no allocation for known tokens
				a.remember(string(obs[i:j]))
			}
		}
		i = j
	}
}

// tokBytes classes the bytes of a token: letters (tokLetter), digits, '-', '_' and '.'
// (tokOther); 0 for every other byte.
var tokBytes = func() (t [256]uint8) {
	for c := range 256 {
		switch {
		case c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			t[c] = tokLetter
		case c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.':
			t[c] = tokOther
		}
	}
	return t
}()

const (
	tokLetter = 1 + iota
	tokOther
)

// remember adds a new token, forgetting the oldest when full.
func (a *randomAgent) remember(tok string) {
	a.seen[tok] = struct{}{}
	if len(a.order) < maxSeen {
		a.order = append(a.order, tok)
		return
	}
	delete(a.seen, a.order[a.next])
	a.order[a.next] = tok
	a.next = (a.next + 1) % maxSeen
}
