package shop

import (
	"encoding/json"
	"strconv"
)

// Observations are encoded by hand, byte for byte what encoding/json makes of the
// observation structs (their field order, omitempty, its escaping of strings): a step's
// observation went through json.Marshal's reflection, a visible share of a worker's CPU
// (see docs/benchmarks.md, Costs the code cites, Shop env).
// FuzzObservationsMatchJSON and TestEveryObservationMatchesJSON hold the two together; a
// type without appendJSON still goes through json.Marshal.

// jsonAppender is an observation that encodes itself.
type jsonAppender interface {
	appendJSON(b []byte) []byte
}

// marshal encodes an observation.
func marshal(v any) []byte {
	if a, ok := v.(jsonAppender); ok {
		return a.appendJSON(make([]byte, 0, 256))
	}
	b, err := json.Marshal(v)
	if err != nil {
		return []byte(`{"ok":false,"error":"internal: observation did not encode"}`)
	}
	return b
}

// object appends one JSON object's members in order.
type object struct {
	b       []byte
	members int
}

func open(b []byte) object { return object{b: append(b, '{')} }

func (o *object) key(k string) {
	if o.members > 0 {
		o.b = append(o.b, ',')
	}
	o.members++
	o.b = append(o.b, '"')
	o.b = append(o.b, k...) // keys are ours: plain ASCII
	o.b = append(o.b, '"', ':')
}

func (o *object) str(k, v string) {
	o.key(k)
	o.b = appendJSONString(o.b, v)
}

func (o *object) int(k string, v int64) {
	o.key(k)
	o.b = strconv.AppendInt(o.b, v, 10)
}

func (o *object) bool(k string, v bool) {
	o.key(k)
	o.b = strconv.AppendBool(o.b, v)
}

func (o *object) close() []byte { return append(o.b, '}') }

func (x resetObs) appendJSON(b []byte) []byte {
	o := open(b)
	o.str("task", x.Task)
	o.str("item", x.Item)
	o.str("category", x.Category)
	o.int("qty", x.Qty)
	o.int("budget", x.Budget)
	o.int("balance", x.Balance)
	o.int("deadline_ms", x.DeadlineMs)
	o.int("max_steps", int64(x.MaxSteps))
	o.key("tools")
	if x.Tools == nil {
		o.b = append(o.b, "null"...)
	} else {
		o.b = append(o.b, '[')
		for i, t := range x.Tools {
			if i > 0 {
				o.b = append(o.b, ',')
			}
			o.b = appendJSONString(o.b, t)
		}
		o.b = append(o.b, ']')
	}
	return o.close()
}

func (x errObs) appendJSON(b []byte) []byte {
	o := open(b)
	o.bool("ok", x.OK)
	if x.Status != 0 {
		o.int("status", int64(x.Status))
	}
	o.str("error", x.Error)
	if x.RetryAfterMs != 0 {
		o.int("retry_after_ms", x.RetryAfterMs)
	}
	if x.Rule != "" {
		o.str("rule", x.Rule)
	}
	if x.Reason != "" {
		o.str("reason", x.Reason)
	}
	if x.Suggestion != "" {
		o.str("suggestion", x.Suggestion)
	}
	return o.close()
}

func (x truncObs) appendJSON(b []byte) []byte {
	o := open(b)
	o.bool("truncated", x.Truncated)
	o.str("body", x.Body)
	return o.close()
}

func (x searchObs) appendJSON(b []byte) []byte {
	o := open(b)
	o.bool("ok", x.OK)
	o.int("total", int64(x.Total))
	o.key("results")
	if x.Results == nil {
		o.b = append(o.b, "null"...)
	} else {
		o.b = append(o.b, '[')
		for i, h := range x.Results {
			if i > 0 {
				o.b = append(o.b, ',')
			}
			ho := open(o.b)
			ho.str("sku", h.SKU)
			ho.str("name", h.Name)
			ho.int("price", h.Price)
			o.b = ho.close()
		}
		o.b = append(o.b, ']')
	}
	return o.close()
}

func (x productObs) appendJSON(b []byte) []byte {
	o := open(b)
	o.bool("ok", x.OK)
	o.str("sku", x.SKU)
	o.str("name", x.Name)
	o.str("category", x.Category)
	o.int("price", x.Price)
	return o.close()
}

func (x stockObs) appendJSON(b []byte) []byte {
	o := open(b)
	o.bool("ok", x.OK)
	o.str("sku", x.SKU)
	o.int("stock", x.Stock)
	return o.close()
}

func (x orderObs) appendJSON(b []byte) []byte {
	o := open(b)
	o.bool("ok", x.OK)
	o.str("order_id", x.OrderID)
	o.str("sku", x.SKU)
	o.int("qty", x.Qty)
	o.int("amount", x.Amount)
	o.str("order_status", x.OrderStatus)
	return o.close()
}

func (x payObs) appendJSON(b []byte) []byte {
	o := open(b)
	o.bool("ok", x.OK)
	o.str("order_id", x.OrderID)
	o.str("order_status", x.OrderStatus)
	o.int("amount", x.Amount)
	o.int("balance", x.Balance)
	return o.close()
}

func (x shipObs) appendJSON(b []byte) []byte {
	o := open(b)
	o.bool("ok", x.OK)
	o.str("order_id", x.OrderID)
	o.str("order_status", x.OrderStatus)
	return o.close()
}

func (x balanceObs) appendJSON(b []byte) []byte {
	o := open(b)
	o.bool("ok", x.OK)
	o.int("balance", x.Balance)
	return o.close()
}

func (x waitObs) appendJSON(b []byte) []byte {
	o := open(b)
	o.bool("ok", x.OK)
	o.int("waited_ms", x.WaitedMs)
	o.int("elapsed_ms", x.ElapsedMs)
	return o.close()
}
