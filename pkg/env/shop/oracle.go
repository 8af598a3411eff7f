package shop

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
)

// oracle is the shop's scripted good agent. It knows only what the observations tell it:
// it searches for the task's item, checks the stock of affordable candidates cheapest
// first, orders qty units of the first with enough stock, pays, and ships. It honours
// retry_after_ms by waiting before retrying, re-issues reads whose response was truncated,
// and after a truncated write asks order.status what happened.
type oracle struct {
	started bool
	task    taskView
	last    env.Action
	// pending is the action to retry once a wait has passed.
	pending *env.Action
	cands   []hit
	next    int
	orderID string
}

// taskView is the part of the first observation (resetObs) the oracle reads.
type taskView struct {
	Item    string `json:"item"`
	Qty     int64  `json:"qty"`
	Budget  int64  `json:"budget"`
	Balance int64  `json:"balance"`
}

// view is the union of the observation fields the oracle reads.
type view struct {
	OK           bool   `json:"ok"`
	Truncated    bool   `json:"truncated"`
	Status       uint32 `json:"status"`
	RetryAfterMs int64  `json:"retry_after_ms"`
	Rule         string `json:"rule"`
	Results      []hit  `json:"results"`
	Stock        int64  `json:"stock"`
	OrderID      string `json:"order_id"`
	OrderStatus  string `json:"order_status"`
}

// Act chooses the next action from the previous one and its observation.
func (o *oracle) Act(t env.Turn) (env.Action, error) {
	if !o.started {
		if !decodeTask(t.Observation, &o.task) {
			if err := json.Unmarshal(t.Observation, &o.task); err != nil {
				o.task = taskView{}
			}
		}
		if o.task.Item == "" || o.task.Qty < 1 {
			return env.Action{}, fmt.Errorf("shop oracle: first observation is not a shop task: %.80s", t.Observation)
		}
		o.started = true
		return o.search(), nil
	}
	var v view
	if !decodeView(t.Observation, &v) {
		if err := json.Unmarshal(t.Observation, &v); err != nil {
			return o.do(o.last), nil // garbled: ask again
		}
	}
	if o.pending != nil && o.last.Tool == "wait" {
		a := *o.pending
		o.pending = nil
		return o.do(a), nil
	}
	switch {
	case v.Truncated:
		switch o.last.Tool {
		case "payment.pay", "shipping.ship":
			return o.call("order.status", str("order_id", o.orderID)), nil
		default: // a read, or an order.create: creating again is harmless, orders reserve nothing
			return o.do(o.last), nil
		}
	case v.Status != 0:
		if v.RetryAfterMs > 0 {
			retry := o.last
			o.pending = &retry
			return o.call("wait", num("ms", min(v.RetryAfterMs, MaxWaitMs))), nil
		}
		return o.do(o.last), nil
	}

	switch o.last.Tool {
	case "catalog.search":
		o.candidates(v.Results)
		return o.checkNext(), nil
	case "inventory.get":
		if v.OK && v.Stock >= o.task.Qty && o.next < len(o.cands) {
			return o.call("order.create", num("qty", o.task.Qty), str("sku", o.cands[o.next].SKU)), nil
		}
		o.next++
		return o.checkNext(), nil
	case "order.create":
		if !v.OK {
			o.next++
			return o.checkNext(), nil
		}
		o.orderID = v.OrderID
		return o.pay(), nil
	case "payment.pay":
		switch {
		case v.OK, v.Rule == RulePayOnce:
			return o.ship(), nil
		case v.Rule == RuleInventoryBeforePayment, v.Rule == RuleSufficientBalance:
			o.next++
			return o.checkNext(), nil
		}
		return o.checkNext(), nil
	case "order.status":
		switch v.OrderStatus {
		case statusCreated:
			return o.pay(), nil
		case statusPaid, statusShipped:
			return o.ship(), nil
		}
		return o.checkNext(), nil
	case "shipping.ship":
		if v.Rule == RuleShipBeforePayment {
			return o.pay(), nil
		}
		return o.call("order.status", str("order_id", o.orderID)), nil
	}
	return o.search(), nil
}

// Follow takes in a step played before the oracle took over (env.Follower): it reads
// the turn as it would have before acting (the task from the first, candidates, stock
// and the order id from the others), then holds the played action as its own last one,
// so the next observation is read as that action's outcome. A wait it would have
// scheduled is dropped unless the played action is that wait.
func (o *oracle) Follow(t env.Turn, played env.Action) {
	_, _ = o.Act(t) // an error (a first observation that is not a task) leaves it unstarted
	if played.Tool != "wait" {
		o.pending = nil
	}
	o.last = played
}

// candidates keeps the search results that name the task's item and whose qty fits both
// budget and balance, cheapest first.
func (o *oracle) candidates(results []hit) {
	limit := min(o.task.Budget, o.task.Balance)
	o.cands, o.next = o.cands[:0], 0
	for _, h := range results {
		if slices.Contains(strings.Fields(h.Name), o.task.Item) && h.Price*o.task.Qty <= limit {
			o.cands = append(o.cands, h)
		}
	}
	slices.SortStableFunc(o.cands, func(a, b hit) int {
		return cmp.Or(cmp.Compare(a.Price, b.Price), cmp.Compare(a.SKU, b.SKU))
	})
}

// checkNext reads the stock of the next candidate, or searches again when none is left.
func (o *oracle) checkNext() env.Action {
	if o.next < len(o.cands) {
		return o.call("inventory.get", str("sku", o.cands[o.next].SKU))
	}
	return o.search()
}

func (o *oracle) search() env.Action {
	return o.call("catalog.search", str("query", o.task.Item))
}

func (o *oracle) pay() env.Action {
	return o.call("payment.pay", str("order_id", o.orderID))
}

func (o *oracle) ship() env.Action {
	return o.call("shipping.ship", str("order_id", o.orderID))
}

// arg is one member of an action's arguments: a string, or an integer when isInt.
type arg struct {
	key   string
	s     string
	n     int64
	isInt bool
}

func str(key, s string) arg       { return arg{key: key, s: s} }
func num(key string, n int64) arg { return arg{key: key, n: n, isInt: true} }

// call acts with args as a JSON object, byte for byte what json.Marshal makes of the
// same members in a map (so args must come in key order), without its reflection and map.
func (o *oracle) call(tool string, args ...arg) env.Action {
	b := make([]byte, 0, 64)
	b = append(b, '{')
	for i, a := range args {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, a.key)
		b = append(b, ':')
		if a.isInt {
			b = strconv.AppendInt(b, a.n, 10)
		} else {
			b = appendJSONString(b, a.s)
		}
	}
	return o.do(env.Action{Tool: tool, Args: append(b, '}')})
}

// appendJSONString appends s quoted as json.Marshal quotes it: directly when it is
// printable ASCII that needs no escape (HTML's <, > and & included, which encoding/json
// escapes), through encoding/json otherwise.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

func (o *oracle) do(a env.Action) env.Action {
	o.last = a
	return a
}
