package world

import (
	"fmt"
	"io"
	"slices"
	"strings"

	celast "cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/types"
)

// Guard is one precondition of a tool: an edge of the causal graph from the state it
// reads to the tool it guards.
type Guard struct {
	// Rule is the causal rule's name; empty for a plain check (an unknown id).
	Rule       string
	Require    string
	Error      string
	Reason     string
	Suggestion string
	// Reads are the state the condition reads: variables and entity.field names.
	Reads []string
	// EnabledBy are the tools whose effects write what the condition reads.
	EnabledBy []string
}

// GraphTool is one tool in the causal graph.
type GraphTool struct {
	Name, Service string
	Guards        []Guard
	// Writes are the state the tool's effects change (variables, entity.field, and
	// entity for a new entity).
	Writes []string
}

// Graph is the world's causal graph: which state guards each tool and which tools
// change that state.
type Graph struct {
	World, Digest string
	Tools         []GraphTool
}

// reads lists the state an expression reads, from its checked syntax tree: the variables
// it names and the fields it selects from entities.
func (w *World) reads(p *program) []string {
	if p == nil || p.ast == nil {
		return nil
	}
	native := p.ast.NativeRep()
	var out []string
	add := func(s string) {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	visit := celast.NewExprVisitor(func(e celast.Expr) {
		switch e.Kind() {
		case celast.IdentKind:
			name := e.AsIdent()
			if slices.ContainsFunc(w.vars, func(v varDef) bool { return v.name == name }) {
				add(name)
			}
			// An entity named to index it or test membership reads its ids.
			if slices.ContainsFunc(w.entities, func(x entityDef) bool { return x.name == name }) {
				add(name)
			}
		case celast.SelectKind:
			sel := e.AsSelect()
			t := native.GetType(sel.Operand().ID())
			if t != nil && t.Kind() == types.StructKind {
				if ent, ok := strings.CutPrefix(t.TypeName(), "world.entity."); ok {
					add(ent + "." + sel.FieldName())
				}
			}
		}
	})
	celast.PostOrderVisit(native.Expr(), visit)
	slices.Sort(out)
	return out
}

// readsIdent reports whether an expression names one of the identifiers.
func readsIdent(p *program, names ...string) bool {
	if p == nil || p.ast == nil {
		return false
	}
	found := false
	celast.PostOrderVisit(p.ast.NativeRep().Expr(), celast.NewExprVisitor(func(e celast.Expr) {
		if e.Kind() == celast.IdentKind && slices.Contains(names, e.AsIdent()) {
			found = true
		}
	}))
	return found
}

func (w *World) writes(t *toolDef) []string {
	var out []string
	if t.msg {
		out = append(out, messageEntity) // each call adds a message
	}
	for _, ef := range t.effects {
		var s string
		switch {
		case ef.add:
			s = w.entities[ef.entity].name
		case ef.setVar >= 0:
			s = w.vars[ef.setVar].name
		case ef.entity >= 0 && ef.field >= 0:
			s = w.entities[ef.entity].name + "." + w.entities[ef.entity].fields[ef.field].name
		default:
			continue
		}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// Graph returns the world's causal graph.
func (w *World) Graph() Graph {
	g := Graph{World: w.name, Digest: w.digest}
	writes := make([][]string, len(w.tools))
	for i := range w.tools {
		writes[i] = w.writes(&w.tools[i])
	}
	for i := range w.tools {
		t := &w.tools[i]
		gt := GraphTool{Name: t.name, Service: t.service, Writes: writes[i]}
		for _, p := range t.pre {
			gd := Guard{Rule: p.rule, Error: p.err, Reads: w.reads(p.require), Reason: templateSource(p.reason), Suggestion: templateSource(p.suggestion)}
			if p.require != nil {
				gd.Require = p.require.src
			}
			for j := range w.tools {
				for _, r := range gd.Reads {
					// A new entity brings all its fields (and makes a membership test hold).
					ent, _, _ := strings.Cut(r, ".")
					if slices.Contains(writes[j], r) || slices.Contains(writes[j], ent) {
						gd.EnabledBy = append(gd.EnabledBy, w.tools[j].name)
						break
					}
				}
			}
			gt.Guards = append(gt.Guards, gd)
		}
		g.Tools = append(g.Tools, gt)
	}
	return g
}

func templateSource(t template) string {
	var sb strings.Builder
	for i, p := range t.parts {
		sb.WriteString(p)
		if i < len(t.exprs) && t.exprs[i] != nil {
			sb.WriteString("${" + t.exprs[i].src + "}")
		}
	}
	return sb.String()
}

// WriteText writes the graph for people: each tool, what it changes, and each guard with
// the state it reads and the tools that change that state.
func (g Graph) WriteText(out io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "world %s (%s)\n", g.World, g.Digest)
	for _, t := range g.Tools {
		svc := t.Service
		if svc == "" {
			svc = "no service"
		}
		fmt.Fprintf(&b, "\n%s [%s]\n", t.Name, svc)
		if len(t.Writes) > 0 {
			fmt.Fprintf(&b, "  changes: %s\n", strings.Join(t.Writes, ", "))
		}
		for _, gd := range t.Guards {
			name := gd.Rule
			if name == "" {
				name = "(check)"
			}
			fmt.Fprintf(&b, "  requires %s: %s\n", name, gd.Require)
			if len(gd.Reads) > 0 {
				fmt.Fprintf(&b, "    reads: %s\n", strings.Join(gd.Reads, ", "))
			}
			if len(gd.EnabledBy) > 0 {
				fmt.Fprintf(&b, "    changed by: %s\n", strings.Join(gd.EnabledBy, ", "))
			}
			if gd.Reason != "" {
				fmt.Fprintf(&b, "    else: %s (%s)\n", gd.Error, gd.Reason)
			} else {
				fmt.Fprintf(&b, "    else: %s\n", gd.Error)
			}
			if gd.Suggestion != "" {
				fmt.Fprintf(&b, "    suggestion: %s\n", gd.Suggestion)
			}
		}
	}
	_, err := io.WriteString(out, b.String())
	return err
}

// WriteDOT writes the graph in Graphviz's DOT language: tools are boxes, state is
// ellipses; an edge from a tool to state is a change, an edge from state to a tool is a
// guard labelled with its rule.
func (g Graph) WriteDOT(out io.Writer) error {
	var b strings.Builder
	q := func(s string) string { return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"` }
	fmt.Fprintf(&b, "digraph %s {\n  rankdir=LR;\n  node [fontname=\"Helvetica\"];\n", q(g.World))
	var state []string
	for _, t := range g.Tools {
		fmt.Fprintf(&b, "  %s [shape=box];\n", q("tool:"+t.Name))
		state = append(state, t.Writes...)
		for _, gd := range t.Guards {
			state = append(state, gd.Reads...)
		}
	}
	slices.Sort(state)
	state = slices.Compact(state)
	for _, s := range state {
		fmt.Fprintf(&b, "  %s [shape=ellipse,label=%s];\n", q("state:"+s), q(s))
	}
	for _, t := range g.Tools {
		for _, w := range t.Writes {
			fmt.Fprintf(&b, "  %s -> %s [style=dashed];\n", q("tool:"+t.Name), q("state:"+w))
		}
		for _, gd := range t.Guards {
			label := gd.Rule
			if label == "" {
				label = gd.Error
			}
			for _, r := range gd.Reads {
				fmt.Fprintf(&b, "  %s -> %s [label=%s];\n", q("state:"+r), q("tool:"+t.Name), q(label))
			}
		}
	}
	b.WriteString("}\n")
	_, err := io.WriteString(out, b.String())
	return err
}

// Describe writes what the world declares, for people: services, limits, state, tools
// with their arguments and rules, the end conditions and whether it has an oracle.
func (w *World) Describe(out io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "world %s\nfile %s\ndigest %s\n", w.name, w.file, w.digest)
	if w.desc != "" {
		fmt.Fprintf(&b, "\n%s\n", w.desc)
	}
	fmt.Fprintf(&b, "\nservices: %s\n", strings.Join(w.services, ", "))
	fmt.Fprintf(&b, "limits: max_steps %d, max_invalid %d, deadline_ms %d\n", w.maxSteps, w.maxInvalid, w.deadlineMs)
	fmt.Fprintf(&b, "generators: state %s, latency %s\n", w.stateStream, w.latencyStream)
	if !w.identify || w.goStrings {
		fmt.Fprintf(&b, "first observation names the world: %v; strings as encoding/json writes them: %v\n", w.identify, w.goStrings)
	}
	if len(w.params) > 0 {
		b.WriteString("\nparams (set by the episode's request):\n")
		for i := range w.params {
			name, typ, def, desc := w.params[i].specParam()
			fmt.Fprintf(&b, "  %s %s = %s by default%s\n", name, typ, def, describeSuffix(desc))
		}
	}
	if len(w.vars) > len(w.params) {
		b.WriteString("\nvariables:\n")
		for i, v := range w.vars {
			if v.draw.param > 0 {
				continue
			}
			path := ""
			if v.path != v.name {
				path = " (in diffs " + v.path + ")"
			}
			fmt.Fprintf(&b, "  %s %s = %s%s%s\n", v.name, v.draw.kind, describeDraw(&v.draw, i, w.vars), path, describeSuffix(v.desc))
		}
	}
	if len(w.entities) > 0 {
		b.WriteString("\nentities:\n")
		for _, e := range w.entities {
			ids := fmt.Sprintf("ids %s1, %s2, ...", e.prefix, e.prefix)
			if e.key >= 0 {
				ids = "ids its " + e.fields[e.key].name
			}
			if e.path != e.name {
				ids += "; in diffs " + e.path
			}
			fmt.Fprintf(&b, "  %s (%s; %s at start)\n", e.name, ids, describeDraw(&e.count, 0, nil))
			for j, f := range e.fields {
				fmt.Fprintf(&b, "    %s %s = %s%s\n", f.name, f.draw.kind, describeDraw(&f.draw, j, e.fields), describeSuffix(f.desc))
			}
		}
	}
	b.WriteString("\ntools:\n")
	for _, t := range w.tools {
		svc := t.service
		if svc == "" {
			svc = "no service"
		}
		fmt.Fprintf(&b, "  %s %s [%s]\n    %s\n", t.name, t.args.usage, svc, t.desc)
		for _, p := range t.pre {
			if p.rule != "" {
				fmt.Fprintf(&b, "    rule %s: %s\n", p.rule, p.require.src)
			}
		}
		for _, r := range t.safety {
			fmt.Fprintf(&b, "    safety %s: %s\n", r.event, r.when.src)
		}
		for _, r := range t.reach {
			how := "reaches"
			if r.read {
				how = "reaches (unless its answer is cut)"
			}
			when := ""
			if r.when != nil {
				when = " when " + r.when.src
			}
			fmt.Fprintf(&b, "    %s milestone %s%s\n", how, w.milestones[r.level-1], when)
		}
	}
	fmt.Fprintf(&b, "\nsuccess: %s\n", w.success.src)
	if w.failure != nil {
		fmt.Fprintf(&b, "failure: %s\n", w.failure.src)
	}
	if len(w.progress) > 0 {
		fmt.Fprintf(&b, "progress milestones: %d\n", len(w.progress))
		for i, p := range w.progress {
			if p != nil {
				fmt.Fprintf(&b, "  %d: %s\n", i+1, p.src)
			} else {
				fmt.Fprintf(&b, "  %d: %s (reached by calls)\n", i+1, w.milestones[i])
			}
		}
	}
	if len(w.roles) > 0 {
		fmt.Fprintf(&b, "\nroles (turns %s; actions are named role:tool):\n", w.turns)
		for _, r := range w.roles {
			names := make([]string, len(r.tools))
			for i, t := range r.tools {
				names[i] = t.name
			}
			keys := make([]string, len(r.view))
			for i, f := range r.view {
				keys[i] = f.key
			}
			fmt.Fprintf(&b, "  %s%s\n    tools: %s\n    view: %s\n    oracle: %d rules\n", r.name, describeSuffix(r.desc),
				strings.Join(names, ", "), strings.Join(keys, ", "), len(r.oracle))
		}
		if w.msg != nil {
			fmt.Fprintf(&b, "messages: %s (each one an entity of %s)\n", w.msg.name, messageEntity)
		}
	} else if w.oracle != nil {
		fmt.Fprintf(&b, "oracle plan: %d steps\n", len(w.oracle.steps))
	} else {
		b.WriteString("oracle plan: none\n")
	}
	_, err := io.WriteString(out, b.String())
	return err
}

func describeSuffix(desc string) string {
	if desc == "" {
		return ""
	}
	return "  # " + desc
}

// describeDraw says how value i of list (nil for a count) is drawn.
func describeDraw(d *draw, i int, list []varDef) string {
	s := describeOne(d)
	if d.when != nil {
		els := fmt.Sprintf("%v", d.kind.zero())
		if d.els != nil {
			els = d.els.src
		}
		s += " when " + d.when.src + ", else " + els
	}
	if d.redraw != nil && d.redrawFrom <= i && list != nil {
		s += fmt.Sprintf(" (from %s, drawn again while %s)", list[d.redrawFrom].name, d.redraw.src)
	}
	return s
}

func describeOne(d *draw) string {
	switch {
	case d.shuffle != nil:
		return "shuffle of 0.." + d.shuffle.src + "-1"
	case d.bits > 0:
		return fmt.Sprintf("%d random bits", d.bits)
	case d.expr != nil:
		return d.expr.src
	case d.lo != nil:
		return fmt.Sprintf("uniform[%s, %s]", d.lo.src, d.hi.src)
	case len(d.choice) > 0:
		parts := make([]string, len(d.choice))
		for i, c := range d.choice {
			parts[i] = fmt.Sprint(c)
		}
		return "one of " + strings.Join(parts, ", ")
	case d.isP:
		return fmt.Sprintf("true with probability %g", d.p)
	case d.value != nil:
		return fmt.Sprintf("%v", d.value)
	}
	return fmt.Sprintf("%v", d.kind.zero())
}
