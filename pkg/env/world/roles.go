package world

import (
	"slices"
	"strings"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/ext"
	"gopkg.in/yaml.v3"
)

// A world with roles is played by several agents over one episode, in the manner of
// PettingZoo's AEC API: one stream of steps, each step the action of the agent whose turn
// it is, each observation addressed to the agent who acts next. The actions of a role are
// its tools named "role:tool"; the ClickHouse column steps.agent is the part before the
// colon, so which agent acted is recorded with no field of its own on the hot path.

// turnOrder says how the agents of a world with roles take their turns.
type turnOrder int

const (
	// turnsAEC: roles act one after another, in file order; each chooses after seeing
	// the state the previous action left.
	turnsAEC turnOrder = iota + 1
	// turnsSimultaneous: roles act once per round, in file order, each choosing from
	// its view at the round's start, so none sees another's move of the same round.
	turnsSimultaneous
)

func (t turnOrder) String() string {
	if t == turnsSimultaneous {
		return "simultaneous"
	}
	return "aec"
}

// roleDef is one role of a world: the tools its agent may call, the private view its
// agent sees at each of its turns, and its oracle's rules.
type roleDef struct {
	name, desc string
	tools      []*toolDef
	view       []obsField
	oracle     []oracleRule
	at         place
}

// oracleRule is one rule of a role's oracle: the first rule whose when holds for the
// observation addressed to the role (turn) gives the call.
type oracleRule struct {
	when *program
	call oracleCall
}

// messageFields are the fields of the message entity every world with a message tool
// has, in this order after id.
var messageFields = []varDef{
	{name: "from", desc: "the sending role", draw: draw{kind: kString}},
	{name: "to", desc: "the receiving role", draw: draw{kind: kString}},
	{name: "text", desc: "what was sent (cut when a truncation fault fired)", draw: draw{kind: kString}},
	{name: "sent_ms", desc: "virtual time it was sent", draw: draw{kind: kInt}},
	{name: "deliver_ms", desc: "virtual time it reaches the receiver (later under latency faults)", draw: draw{kind: kInt}},
	{name: "lost", desc: "an injected error dropped it: it never arrives", draw: draw{kind: kBool}},
}

// messageEntity is the entity collection that holds a world's messages.
const messageEntity = "message"

var (
	roleKeys    = []string{"description", "tools", "view", "oracle"}
	messageKeys = []string{"tool"}
	ruleKeys    = []string{"when", "call", "args"}
)

// Roles names the world's roles in their turn order; it is empty for a world of one
// agent.
func (w *World) Roles() []string {
	out := make([]string, len(w.roles))
	for i, r := range w.roles {
		out[i] = r.name
	}
	return out
}

// declareMessages declares the message entity when the file has messages, before the
// state is handed to CEL, so that every expression may read the messages.
func (c *compiler) declareMessages(n *yaml.Node) {
	if n == nil {
		return
	}
	if c.taken(messageEntity) {
		c.d.errAt(at(n, "messages"), "a world with messages keeps them in the entity %q; the file declares that name already", messageEntity)
		return
	}
	e := entityDef{name: messageEntity, path: messageEntity, key: -1, prefix: "m-", typeName: "world.entity." + messageEntity, count: draw{kind: kInt, value: int64(0)},
		fields: slices.Clone(messageFields)}
	names := []string{"id"}
	ftypes := []*cel.Type{cel.StringType}
	for _, fd := range e.fields {
		names = append(names, fd.name)
		ftypes = append(ftypes, fd.draw.kind.cel())
	}
	e.otype = c.prov.declare(e.typeName, names, ftypes)
	c.w.entities = append(c.w.entities, e)
	c.w.msgEntity = len(c.w.entities) - 1
}

// roles reads turns, roles and messages, after the tools.
func (c *compiler) roles(turnsNode, rolesNode, msgNode, oracleNode *yaml.Node) {
	d, w := c.d, c.w
	if rolesNode == nil {
		for _, x := range []struct {
			n   *yaml.Node
			key string
		}{{turnsNode, "turns"}, {msgNode, "messages"}} {
			if x.n != nil {
				d.errAt(at(x.n, x.key), "only a world with roles has %s", x.key)
			}
		}
		return
	}
	w.turns = turnsAEC
	if turnsNode != nil {
		switch s, _ := d.text(turnsNode, "turns"); s {
		case "aec":
		case "simultaneous":
			w.turns = turnsSimultaneous
		default:
			d.errAt(at(turnsNode, "turns"), "want aec or simultaneous, got %q", clip(s))
		}
	}
	if oracleNode != nil {
		d.errAt(at(oracleNode, "oracle"), "a world with roles gives each role its oracle (roles.NAME.oracle), not one plan")
	}
	for _, f := range w.reset {
		// The first observation goes on with the roles and the first agent's turn.
		p := f.val
		if p == nil {
			p = f.each
		}
		if p != nil && slices.Contains([]string{"roles", "turns", "agent", "answer", "inbox", "view"}, f.key) {
			d.errAt(p.at, "key %q is gauntlet's own in a world with roles; choose another", f.key)
		}
	}
	if msgNode != nil {
		for _, m := range d.mapping(msgNode, "messages", messageKeys...) {
			if s, ok := d.text(m.v, "messages.tool"); ok {
				if t := c.lookupTool(s); t == nil {
					d.errAt(at(m.v, "messages.tool"), "unknown tool %q", clip(s))
				} else {
					c.messageTool(t, m.v)
				}
			}
		}
		if !hasKey(msgNode, "tool") && resolve(msgNode) != nil && resolve(msgNode).Kind == yaml.MappingNode {
			d.errAt(at(msgNode, "messages.tool"), "required: the tool agents send messages with")
		}
	}
	turnEnv, err := cel.NewEnv(cel.CustomTypeProvider(c.prov), ext.Strings(), ext.Lists(), ext.Math(), ext.Bindings(), ext.TwoVarComprehensions(),
		cel.Variable("turn", cel.MapType(cel.StringType, cel.DynType)))
	if err != nil {
		d.errAt(at(rolesNode, "roles"), "declare turn: %v", err)
		return
	}
	used := map[*toolDef]bool{}
	for _, m := range d.mapping(rolesNode, "roles") {
		f := sub("roles", m.key)
		if !validName(m.key, false) {
			d.errAt(at(m.k, f), "bad role name %q: want a letter, then letters, digits or _", clip(m.key))
			continue
		}
		r := roleDef{name: m.key, at: at(m.k, f)}
		for _, rm := range d.mapping(m.v, f, roleKeys...) {
			rf := sub(f, rm.key)
			switch rm.key {
			case "description":
				r.desc, _ = d.text(rm.v, rf)
			case "tools":
				for i, tn := range d.sequence(rm.v, rf) {
					s, ok := d.text(tn, idx(rf, i))
					if !ok {
						continue
					}
					t := c.lookupTool(s)
					switch {
					case t == nil:
						d.errAt(at(tn, idx(rf, i)), "unknown tool %q (declared: %s)", clip(s), strings.Join(w.toolNames, ", "))
					case slices.Contains(r.tools, t):
						d.errAt(at(tn, idx(rf, i)), "tool %q is listed twice", s)
					default:
						r.tools = append(r.tools, t)
						used[t] = true
					}
				}
			case "view":
				r.view = c.observation(c.base, rm.v, rf)
			case "oracle":
				// Compiled below, once the role's tools are known.
			}
		}
		if len(r.tools) == 0 && resolve(m.v) != nil && resolve(m.v).Kind == yaml.MappingNode {
			d.errAt(at(m.v, sub(f, "tools")), "required: at least one tool the role's agent may call")
		}
		if on := valueOf(m.v, "oracle"); on != nil {
			c.plan = true
			for i, rn := range d.sequence(on, sub(f, "oracle")) {
				r.oracle = append(r.oracle, c.oracleRule(turnEnv, &r, rn, idx(sub(f, "oracle"), i)))
			}
			c.plan = false
			if k := len(r.oracle); k > 0 && r.oracle[k-1].when != nil {
				d.errAt(at(on, sub(f, "oracle")), "the last rule has no when: it is what the role does when no other rule holds")
			}
		}
		w.roles = append(w.roles, r)
	}
	if len(w.roles) < 2 && resolve(rolesNode) != nil && resolve(rolesNode).Kind == yaml.MappingNode {
		d.errAt(at(rolesNode, "roles"), "at least two roles (a world for one agent declares none)")
	}
	for i := range w.tools {
		if t := &w.tools[i]; !used[t] && t.name != "" {
			d.errAt(t.at, "tool %q belongs to no role: list it in a role's tools", t.name)
		}
	}
	if w.msg != nil {
		if p := w.msg.args.prop("to"); p != nil {
			for _, v := range p.enum {
				if !slices.ContainsFunc(w.roles, func(r roleDef) bool { return r.name == v }) {
					d.errAt(at(msgNode, "messages.tool"), "tool %s: argument to names %q, which is no role", w.msg.name, clip(v))
				}
			}
		}
	}
	for _, r := range w.roles {
		for _, t := range r.tools {
			w.qualNames = append(w.qualNames, r.name+":"+t.name)
		}
		if (len(r.oracle) > 0) != (len(w.roles[0].oracle) > 0) {
			d.errAt(r.at, "either every role has an oracle or none has")
		}
	}
	w.hasRoleOracle = len(w.roles) > 0 && len(w.roles[0].oracle) > 0
}

// messageTool checks the tool messages are sent with: it reaches a service (where its
// faults come from), takes the receiving role and the text, and changes nothing itself
// (gauntlet adds the message).
func (c *compiler) messageTool(t *toolDef, n *yaml.Node) {
	d := c.d
	f := "messages.tool"
	if t.svc < 0 {
		d.errAt(at(n, f), "tool %s needs a service: a message's faults (delay, loss) are that service's", t.name)
	}
	to, text := t.args.prop("to"), t.args.prop("text")
	if to == nil || to.kind != kString || !to.required {
		d.errAt(at(n, f), "tool %s needs a required string argument to (the receiving role)", t.name)
	}
	if text == nil || text.kind != kString || !text.required {
		d.errAt(at(n, f), "tool %s needs a required string argument text", t.name)
	}
	if len(t.args.props) != 2 {
		d.errAt(at(n, f), "tool %s takes exactly the arguments to and text", t.name)
	}
	if len(t.effects) > 0 || len(t.obs) > 0 || t.spend != nil || t.advance != nil {
		d.errAt(at(n, f), "tool %s is the message tool: gauntlet adds the message and answers it, so it declares no effects, observation, spend or advance_ms", t.name)
	}
	if to == nil || text == nil {
		return
	}
	t.msg = true
	for i, p := range t.args.props {
		switch p.name {
		case "to":
			t.msgTo = i
		case "text":
			t.msgText = i
		}
	}
	c.w.msg = t
}

// oracleRule reads one rule of a role's oracle: a call of one of the role's tools, when
// a condition over the observation addressed to the role holds.
func (c *compiler) oracleRule(env *cel.Env, r *roleDef, n *yaml.Node, f string) oracleRule {
	var rule oracleRule
	var callNode, argsNode *yaml.Node
	for _, m := range c.d.mapping(n, f, ruleKeys...) {
		switch m.key {
		case "when":
			rule.when = c.compile(env, m.v, sub(f, "when"), cel.BoolType)
		case "call":
			callNode = m.v
		case "args":
			argsNode = m.v
		}
	}
	rule.call = c.oracleCall(env, n, callNode, argsNode, f)
	if rule.call.tool != nil && !slices.Contains(r.tools, rule.call.tool) {
		c.d.errAt(at(callNode, sub(f, "call")), "tool %s is not one of role %s's tools", rule.call.tool.name, r.name)
	}
	return rule
}
