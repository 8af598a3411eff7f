package shop

import (
	"strconv"

	"github.com/gauntlet-rl/gauntlet/pkg/canonjson"
)

// diff accumulates one step's world-state changes as a canonical JSON array, in the order
// they happened: {"op":"set","path":...,"from":...,"to":...} for a changed value and
// {"op":"add","path":...,"to":{...}} for a new entity.
type diff struct {
	b []byte
}

func (d *diff) open(op, path string) {
	if len(d.b) == 0 {
		d.b = append(d.b, '[')
	} else {
		d.b = append(d.b, ',')
	}
	d.b = append(d.b, `{"op":`...)
	d.b = canonjson.AppendString(d.b, op)
	d.b = append(d.b, `,"path":`...)
	d.b = canonjson.AppendString(d.b, path)
}

func (d *diff) setInt(path string, from, to int64) {
	d.open("set", path)
	d.b = append(d.b, `,"from":`...)
	d.b = strconv.AppendInt(d.b, from, 10)
	d.b = append(d.b, `,"to":`...)
	d.b = strconv.AppendInt(d.b, to, 10)
	d.b = append(d.b, '}')
}

func (d *diff) setString(path, from, to string) {
	d.open("set", path)
	d.b = append(d.b, `,"from":`...)
	d.b = canonjson.AppendString(d.b, from)
	d.b = append(d.b, `,"to":`...)
	d.b = canonjson.AppendString(d.b, to)
	d.b = append(d.b, '}')
}

func (d *diff) addOrder(path, sku string, qty, amount int64, status string) {
	d.open("add", path)
	d.b = append(d.b, `,"to":{"sku":`...)
	d.b = canonjson.AppendString(d.b, sku)
	d.b = append(d.b, `,"qty":`...)
	d.b = strconv.AppendInt(d.b, qty, 10)
	d.b = append(d.b, `,"amount":`...)
	d.b = strconv.AppendInt(d.b, amount, 10)
	d.b = append(d.b, `,"status":`...)
	d.b = canonjson.AppendString(d.b, status)
	d.b = append(d.b, "}}"...)
}

// bytes returns the finished array ("[]" when nothing changed) in a fresh slice.
func (d *diff) bytes() []byte {
	if len(d.b) == 0 {
		return []byte("[]")
	}
	out := make([]byte, len(d.b)+1)
	copy(out, d.b)
	out[len(d.b)] = ']'
	return out
}
