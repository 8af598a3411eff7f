package scoring

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// MaxFileBytes bounds a reward spec file: specs travel in KV values and score replies.
const MaxFileBytes = 64 << 10

// maxComponents bounds a spec's vector, and maxWindow a running z-score's window, since
// both cost per step.
const (
	maxComponents = 32
	maxWindow     = 10_000
)

// ErrInvalidSpec is wrapped by every error Parse reports about a spec file's content.
var ErrInvalidSpec = errors.New("invalid reward spec")

//go:embed default.yaml
var defaultFile []byte

// DefaultFile returns the text of the built-in spec, DefaultVersion.
func DefaultFile() []byte { return bytes.Clone(defaultFile) }

// file is a reward spec file as written (docs/rewards.md): every key is known, the
// decoder refuses any other.
type file struct {
	Name        string          `yaml:"name"`
	Version     string          `yaml:"version"`
	Description string          `yaml:"description"`
	Components  []componentFile `yaml:"components"`
}

type componentFile struct {
	Name        string         `yaml:"name"`
	Description string         `yaml:"description"`
	Builtin     string         `yaml:"builtin"`
	Expr        string         `yaml:"expr"`
	Potential   *potentialFile `yaml:"potential"`
	Detector    *detectorFile  `yaml:"detector"`
	// Verifier names one of the numbers a task's verifier wrote (reward.json's names;
	// "reward" for reward.txt): the component's raw value on the verdict step, 0 on others.
	Verifier  string      `yaml:"verifier"`
	Weight    *float64    `yaml:"weight"`
	Normalise []stageFile `yaml:"normalise"`
}

type potentialFile struct {
	Expr  string   `yaml:"expr"`
	Gamma *float64 `yaml:"gamma"`
}

// detectorFile is an anti-hacking detector: a component that is -1 on the steps it flags
// and 0 on the others (docs/rewards.md, Detectors).
type detectorFile struct {
	Kind   string `yaml:"kind"`
	Window int    `yaml:"window"`
	// Faults is what a counting detector (idle, repeat) does with a step an injected
	// fault answered: FaultsHold or FaultsCount (the default, when empty).
	Faults string `yaml:"faults"`
}

type stageFile struct {
	Clip   []float64   `yaml:"clip"`
	Scale  *float64    `yaml:"scale"`
	ZScore *zscoreFile `yaml:"zscore"`
}

type zscoreFile struct {
	Window int `yaml:"window"`
}

var (
	specNameRE      = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]*$`)
	specVersionRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)
	componentNameRE = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
)

// LoadFile reads and parses the reward spec file at path (see Parse).
func LoadFile(path string) (Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Spec{}, fmt.Errorf("read reward spec: %w", err)
	}
	return Parse(path, data)
}

// Parse parses, validates and compiles a reward spec file; where names the file in errors.
// Every problem is reported at once, each as "where:line: field: reason", wrapping
// ErrInvalidSpec: unknown keys, values of the wrong type, a missing name, version or
// weight, a component that is not exactly one of builtin, expr and potential, an unknown
// built-in, a CEL expression that does not compile or type-check to a number or a bool,
// and normalisation stages out of range. The spec's Digest is the SHA-256 of data, so the
// same file always has the same digest.
func Parse(where string, data []byte) (Spec, error) {
	if len(data) > MaxFileBytes {
		return Spec{}, fmt.Errorf("%s: %w: %d bytes is more than %d", where, ErrInvalidSpec, len(data), MaxFileBytes)
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return Spec{}, fmt.Errorf("%s: %w: %s", where, ErrInvalidSpec, yamlMessage(where, err))
	}
	if root.Kind == 0 || len(root.Content) == 0 {
		return Spec{}, fmt.Errorf("%s: %w: empty document", where, ErrInvalidSpec)
	}
	p := &parser{where: where, root: root.Content[0]}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f file
	if err := dec.Decode(&f); err != nil {
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			return Spec{}, fmt.Errorf("%s: %w: %s", where, ErrInvalidSpec, yamlMessage(where, err))
		}
		for _, e := range te.Errors {
			p.errs = append(p.errs, yamlMessage(where, errors.New(unknownKey(e))))
		}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		p.errs = append(p.errs, where+": more than one YAML document; put one spec per file")
	}
	spec := p.spec(&f)
	if len(p.errs) > 0 {
		slices.SortStableFunc(p.errs, func(a, b string) int { return cmp.Compare(lineNumber(a), lineNumber(b)) })
		return Spec{}, fmt.Errorf("%w:\n%s", ErrInvalidSpec, strings.Join(p.errs, "\n"))
	}
	sum := sha256.Sum256(data)
	spec.Digest = "sha256:" + hex.EncodeToString(sum[:])
	spec.Source = string(data)
	return spec, nil
}

// yamlMessage rewrites yaml.v3's "yaml: line N: msg" as "where:N: msg".
func yamlMessage(where string, err error) string {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if n, tail, ok := strings.Cut(rest, ": "); ok {
			if _, err := strconv.Atoi(n); err == nil {
				return where + ":" + n + ": " + tail
			}
		}
	}
	return where + ": " + msg
}

// unknownKeyRE matches yaml.v3's report of a key the decoder does not know.
var unknownKeyRE = regexp.MustCompile(`field (\S+) not found in type scoring\.(\w+)$`)

// knownKeys lists each part of a spec file's keys, for the error about an unknown one.
var knownKeys = map[string]string{
	"file":          "name, version, description, components",
	"componentFile": "name, description, builtin, expr, potential, detector, verifier, weight, normalise",
	"potentialFile": "expr, gamma",
	"detectorFile":  "kind, window, faults",
	"stageFile":     "clip, scale, zscore",
	"zscoreFile":    "window",
}

// unknownKey rewrites yaml.v3's "field x not found in type scoring.file" in the file's terms.
func unknownKey(msg string) string {
	m := unknownKeyRE.FindStringSubmatchIndex(msg)
	if m == nil {
		return msg
	}
	key, typ := msg[m[2]:m[3]], msg[m[4]:m[5]]
	return fmt.Sprintf("%s%s: unknown key (known here: %s)", msg[:m[0]], key, knownKeys[typ])
}

// lineNumber reads the line of a "where:line: ..." message (0 when it has none).
func lineNumber(msg string) int {
	i := strings.Index(msg, ":")
	if i < 0 {
		return 0
	}
	rest := msg[i+1:]
	j := strings.Index(rest, ":")
	if j < 0 {
		return 0
	}
	n, _ := strconv.Atoi(rest[:j])
	return n
}

// parser collects the problems of one file, each naming the line of the field at fault.
type parser struct {
	where string
	root  *yaml.Node
	errs  []string
}

// add records a problem of the field at path (map keys and sequence indexes from the
// document's root), on the line of the deepest part of the path the file has.
func (p *parser) add(path []any, format string, a ...any) {
	p.errs = append(p.errs, fmt.Sprintf("%s:%d: %s: %s", p.where, p.line(path), fieldName(path), fmt.Sprintf(format, a...)))
}

func (p *parser) line(path []any) int {
	n, line := p.root, p.root.Line
	for _, step := range path {
		var next *yaml.Node
		switch s := step.(type) {
		case string:
			if n.Kind == yaml.MappingNode {
				for i := 0; i+1 < len(n.Content); i += 2 {
					if n.Content[i].Value == s {
						next, line = n.Content[i+1], n.Content[i].Line
						break
					}
				}
			}
		case int:
			if n.Kind == yaml.SequenceNode && s < len(n.Content) {
				next = n.Content[s]
				line = next.Line
			}
		}
		if next == nil {
			break
		}
		n = next
	}
	return line
}

func fieldName(path []any) string {
	var b strings.Builder
	for _, step := range path {
		switch s := step.(type) {
		case string:
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(s)
		case int:
			fmt.Fprintf(&b, "[%d]", s)
		}
	}
	return b.String()
}

func at(path []any, more ...any) []any {
	return append(append(make([]any, 0, len(path)+len(more)), path...), more...)
}

// spec validates f and compiles its components.
func (p *parser) spec(f *file) Spec {
	switch {
	case f.Name == "":
		p.add([]any{"name"}, "must not be empty")
	case !specNameRE.MatchString(f.Name):
		p.add([]any{"name"}, "%q: use lowercase letters, digits, '_', '-' and '.'", f.Name)
	}
	switch {
	case f.Version == "":
		p.add([]any{"version"}, "must not be empty (a new formula or weight is a new version)")
	case !specVersionRE.MatchString(f.Version):
		p.add([]any{"version"}, "%q: use letters, digits, '_', '-' and '.'", f.Version)
	}
	if len(f.Components) == 0 {
		p.add([]any{"components"}, "must declare at least one component")
	}
	if len(f.Components) > maxComponents {
		p.add([]any{"components"}, "%d components is more than %d", len(f.Components), maxComponents)
	}
	spec := Spec{Name: f.Name, Version: f.Name + "/" + f.Version, Weights: make([]Weight, 0, len(f.Components))}
	c := &compiled{comps: make([]comp, 0, len(f.Components)), plain: true}
	seen := map[string]int{}
	for i, cf := range f.Components {
		path := []any{"components", i}
		switch {
		case cf.Name == "":
			p.add(at(path, "name"), "must not be empty")
		case !componentNameRE.MatchString(cf.Name):
			p.add(at(path, "name"), "%q: use lowercase letters, digits and '_', starting with a letter", cf.Name)
		default:
			if j, dup := seen[cf.Name]; dup {
				p.add(at(path, "name"), "duplicate component %q (first at components[%d])", cf.Name, j)
			}
			seen[cf.Name] = i
		}
		var w float64
		switch {
		case cf.Weight == nil:
			p.add(at(path, "weight"), "must be set (0 reports the component without counting it)")
		case !(*cf.Weight >= 0) || math.IsInf(*cf.Weight, 1):
			p.add(at(path, "weight"), "%v must be a finite number >= 0", *cf.Weight)
		default:
			w = *cf.Weight
		}
		spec.Weights = append(spec.Weights, Weight{Component: cf.Name, Weight: w})
		cp := p.component(path, cf, c)
		cp.pot = -1
		if cp.kind == kindPotential || cp.kind == kindDetector && (cp.detector == DetectorIdle || cp.detector == DetectorRepeat) {
			cp.pot = c.potentials
			c.potentials++
		}
		c.comps = append(c.comps, cp)
		if cp.kind != kindBuiltin || len(cp.stages) > 0 {
			c.plain = false
		}
	}
	// Expressions alone keep nothing from one step to the next.
	c.stateful = c.potentials > 0 || c.windows > 0 || c.episode
	spec.c = c
	return spec
}

// faults validates what a counting detector does with a step a fault answered, and
// reports whether it holds. Without the key it counts, as every file written before the
// option was scored: a file's digest names what its scores mean, so a file that says
// nothing keeps meaning what it meant.
func (p *parser) faults(dp []any, d *detectorFile) bool {
	switch d.Faults {
	case FaultsHold:
		return true
	case "", FaultsCount:
		return false
	}
	p.add(at(dp, "faults"), "%q: must be %s (a step an injected fault answered neither counts nor breaks the row) or %s (it counts like any step; the default)",
		d.Faults, FaultsHold, FaultsCount)
	return false
}

// holdRule is what Explain says of a counting detector's faults option.
func holdRule(detector string, hold bool) string {
	switch {
	case !hold:
		return "; faults count: a step an injected fault answered counts like any other"
	case detector == DetectorRepeat:
		return "; faults hold: a retry an injected fault answered (http_error, truncate, ...) is not counted and keeps the row, another action ends it"
	}
	return "; faults hold: a step an injected fault answered (http_error, truncate, ...) is not counted and keeps the count"
}

// component validates one component and compiles its source and stages.
func (p *parser) component(path []any, cf componentFile, c *compiled) comp {
	var cp comp
	sources := 0
	if cf.Builtin != "" {
		sources++
		cp.kind, cp.builtin = kindBuiltin, cf.Builtin
		if !isComponent(cf.Builtin) {
			p.add(at(path, "builtin"), "%v %q (known: %s)", ErrUnknownComponent, cf.Builtin, strings.Join(components, ", "))
		}
		cp.rule = "builtin " + cf.Builtin
	}
	if cf.Expr != "" {
		sources++
		cp.kind, cp.rule = kindExpr, "expr "+cf.Expr
		prg, nat, ep, err := compileChecked(cf.Expr)
		if err != nil {
			p.add(at(path, "expr"), "%v", err)
		}
		cp.prg, cp.native, cp.field = prg, nat, fieldOnly(cf.Expr)
		c.episode = c.episode || ep
	}
	if cf.Potential != nil {
		sources++
		pp := at(path, "potential")
		cp.kind = kindPotential
		if cf.Potential.Expr == "" {
			p.add(at(pp, "expr"), "must be set: the potential of the state after a step")
		} else if prg, nat, ep, err := compileChecked(cf.Potential.Expr); err != nil {
			p.add(at(pp, "expr"), "%v", err)
		} else {
			cp.prg, cp.native, cp.field = prg, nat, fieldOnly(cf.Potential.Expr)
			c.episode = c.episode || ep
		}
		switch g := cf.Potential.Gamma; {
		case g == nil:
			p.add(at(pp, "gamma"), "must be set: the trainer's discount, in (0, 1]")
		case !(*g > 0 && *g <= 1):
			p.add(at(pp, "gamma"), "%v must be in (0, 1]", *g)
		default:
			cp.gamma = *g
		}
		cp.rule = fmt.Sprintf("potential gamma*phi(after) - phi(before), phi = %s, gamma = %v", cf.Potential.Expr, cp.gamma)
	}
	if cf.Detector != nil {
		sources++
		dp := at(path, "detector")
		cp.kind, cp.detector = kindDetector, cf.Detector.Kind
		switch cf.Detector.Kind {
		case DetectorIdle:
			if w := cf.Detector.Window; w < 2 || w > maxWindow {
				p.add(at(dp, "window"), "%d must be in [2, %d] steps", w, maxWindow)
			}
			cp.window = cf.Detector.Window
			cp.hold = p.faults(dp, cf.Detector)
			cp.rule = fmt.Sprintf("detector idle: -1 from the %dth step in a row that does not advance the task", cp.window) + holdRule(DetectorIdle, cp.hold)
		case DetectorVerifierPaths:
			if cf.Detector.Window != 0 {
				p.add(at(dp, "window"), "verifier_paths has no window")
			}
			if cf.Detector.Faults != "" {
				p.add(at(dp, "faults"), "verifier_paths counts no steps: only idle and repeat take faults")
			}
			cp.rule = "detector verifier_paths: -1 on a step that wrote to or planted in the verifier's paths"
		case DetectorRepeat:
			if w := cf.Detector.Window; w < 2 || w > maxWindow {
				p.add(at(dp, "window"), "%d must be in [2, %d] steps", w, maxWindow)
			}
			cp.window, cp.slot = cf.Detector.Window, c.windows
			c.windows++
			c.actions = true
			cp.hold = p.faults(dp, cf.Detector)
			cp.rule = fmt.Sprintf("detector repeat: -1 from the %dth identical action (tool and arguments) in a row", cp.window) + holdRule(DetectorRepeat, cp.hold)
		case DetectorCanary:
			if cf.Detector.Window != 0 {
				p.add(at(dp, "window"), "canary has no window")
			}
			if cf.Detector.Faults != "" {
				p.add(at(dp, "faults"), "canary counts no steps: only idle and repeat take faults")
			}
			cp.rule = "detector canary: -1 on the verdict's step of a canary task the verifier passed"
		case DetectorFingerprint:
			if cf.Detector.Window != 0 {
				p.add(at(dp, "window"), "fingerprint has no window")
			}
			if cf.Detector.Faults != "" {
				p.add(at(dp, "faults"), "fingerprint counts no steps: only idle and repeat take faults")
			}
			cp.rule = "detector fingerprint: -1 on a step whose action matched a threat fingerprint"
		default:
			p.add(at(dp, "kind"), "unknown detector %q (known: %s)", cf.Detector.Kind, strings.Join(detectorKinds, ", "))
		}
	}
	c.faults = c.faults || cp.hold
	if cf.Verifier != "" {
		sources++
		cp.kind, cp.verifier = kindVerifier, cf.Verifier
		cp.rule = "verifier " + strconv.Quote(cf.Verifier)
	}
	if sources != 1 {
		p.add(path, "must have exactly one of builtin, expr, potential, detector and verifier (has %d)", sources)
	}
	for j, sf := range cf.Normalise {
		sp := at(path, "normalise", j)
		set := 0
		var st stage
		if sf.Clip != nil {
			set++
			switch {
			case len(sf.Clip) != 2:
				p.add(at(sp, "clip"), "must be [low, high], has %d numbers", len(sf.Clip))
			case !(sf.Clip[0] <= sf.Clip[1]) || math.IsInf(sf.Clip[0], 0) || math.IsInf(sf.Clip[1], 0):
				p.add(at(sp, "clip"), "[%v, %v] must be finite with low <= high", sf.Clip[0], sf.Clip[1])
			default:
				st = stage{op: opClip, lo: sf.Clip[0], hi: sf.Clip[1]}
			}
		}
		if sf.Scale != nil {
			set++
			if math.IsNaN(*sf.Scale) || math.IsInf(*sf.Scale, 0) {
				p.add(at(sp, "scale"), "%v must be a finite number", *sf.Scale)
			}
			st = stage{op: opScale, factor: *sf.Scale}
		}
		if sf.ZScore != nil {
			set++
			if w := sf.ZScore.Window; w < 2 || w > maxWindow {
				p.add(at(sp, "zscore", "window"), "%d must be in [2, %d] steps", w, maxWindow)
			}
			st = stage{op: opZScore, window: sf.ZScore.Window, slot: c.windows}
			c.windows++
		}
		if set != 1 {
			p.add(sp, "must have exactly one of clip, scale and zscore (has %d)", set)
		}
		cp.stages = append(cp.stages, st)
	}
	return cp
}
